"""The tensor-by-tensor safetensors reader against safetensors' own writer: every dtype read back bit for bit,
one tensor's memory per read (the file is never mapped or read whole), and malformed files refused."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from xtrain.loss import peak_allocated_bytes
from xtrain.model.safetensors_file import SafetensorsFile, SafetensorsFormatError

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int8]


def test_reads_back_what_safetensors_wrote_bit_for_bit(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    tensors = {f"t.{dtype}": (torch.randn(3, 5, generator=generator) * 50).to(dtype) for dtype in DTYPES}
    tensors["scalar"] = torch.tensor(2.5)
    tensors["empty"] = torch.zeros(0, 4)
    tensors["flags"] = torch.tensor([True, False, True])
    save_file(tensors, str(tmp_path / "w.safetensors"), metadata={"format": "pt"})
    with SafetensorsFile(tmp_path / "w.safetensors") as file:
        assert sorted(file.keys()) == sorted(tensors)
        for key, want in tensors.items():
            got = file.read(key)
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got, want), key
        with pytest.raises(KeyError):
            file.read("absent")


def test_a_read_allocates_that_tensor_only(tmp_path: Path) -> None:
    tensors = {f"w{i}": torch.randn(64, 256) for i in range(16)}  # 64 KiB each, 1 MiB in all
    save_file(tensors, str(tmp_path / "w.safetensors"))
    with SafetensorsFile(tmp_path / "w.safetensors") as file:
        peak = peak_allocated_bytes(lambda: file.read("w7"))
    assert peak == 64 * 256 * 4


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x01\x00", "shorter than"),
        ((10**9).to_bytes(8, "little") + b"{}", "does not fit"),
        ((3).to_bytes(8, "little") + b"{x}", "not JSON"),
        ((2).to_bytes(8, "little") + b"[]", "not a JSON object"),
        ((60).to_bytes(8, "little") + b'{"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}', "unknown dtype"),
        ((62).to_bytes(8, "little") + b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}} ', "offsets"),
    ],
)
def test_malformed_files_are_refused_saying_why(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content + b"\x00" * 4)
    with pytest.raises(SafetensorsFormatError, match=message):
        SafetensorsFile(path)
