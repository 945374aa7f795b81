"""Reading a safetensors file one tensor at a time, into memory PyTorch allocates, never mapping the whole file.

``safetensors.safe_open`` (0.8) maps the whole file into one PyTorch storage as it opens it and hands out views
of it: every process that loads a checkpoint then holds a storage the size of the file (each rank of a sharded
load the whole shard file, not its share), and PyTorch's allocator reports it as such. Here the header is parsed
by hand (the format is an 8-byte little-endian header length, a JSON header, then the raw little-endian bytes)
and each tensor is read with ``readinto`` straight into a tensor allocated for it alone, so a loader that copies
and drops each tensor holds at most one checkpoint tensor at a time.
"""

from __future__ import annotations

import ctypes
import io
import json
import math
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch import Tensor

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_Entry = tuple[torch.dtype, list[int], int, int]
"""dtype, shape, start and end byte of the tensor's data (relative to the end of the header)."""
_MAX_HEADER_BYTES = 100 * 1024**2  # the format's own limit: a larger "length" means this is not such a file


class SafetensorsFormatError(ValueError):
    """The file is not a well-formed safetensors file (the message says what is wrong)."""


class SafetensorsFile:
    """An open safetensors file: its keys, and each tensor read on demand (use as a context manager)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: io.BufferedReader = self.path.open("rb")
        try:
            self._entries, self._data_start = _read_header(self._file, self.path.stat().st_size)
        except BaseException:
            self._file.close()
            raise

    def keys(self) -> list[str]:
        return list(self._entries)

    def read(self, key: str) -> Tensor:
        """The tensor stored under ``key`` (KeyError if absent), in its stored dtype, on the CPU."""
        dtype, shape, start, end = self._entries[key]
        tensor = torch.empty(shape, dtype=dtype)
        nbytes = end - start
        if nbytes:
            # A writable view of the tensor's own memory: the bytes go from the file straight into it.
            view = memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")
            self._file.seek(self._data_start + start)
            done = 0
            while done < nbytes:
                count = self._file.readinto(view[done:])
                if not count:
                    raise SafetensorsFormatError(f"the data of {key!r} ends early (truncated file)")
                done += count
        return tensor

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _read_header(file: io.BufferedReader, file_size: int) -> tuple[dict[str, _Entry], int]:
    prefix = file.read(8)
    if len(prefix) < 8:
        raise SafetensorsFormatError("shorter than the 8-byte header length")
    header_bytes = int.from_bytes(prefix, "little")
    if header_bytes > min(_MAX_HEADER_BYTES, file_size - 8):
        raise SafetensorsFormatError(f"header length {header_bytes} does not fit in the file")
    try:
        header: Any = json.loads(file.read(header_bytes))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SafetensorsFormatError(f"header is not JSON ({error})") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError("header is not a JSON object")
    data_start = 8 + header_bytes
    entries: dict[str, _Entry] = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = [int(size) for size in entry["shape"]]
            start, end = (int(offset) for offset in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise SafetensorsFormatError(f"header entry of {key!r} is malformed or has an unknown dtype") from None
        expected = math.prod(shape) * dtype.itemsize
        if end - start != expected or start < 0 or data_start + end > file_size:
            raise SafetensorsFormatError(f"data offsets of {key!r} do not match its shape or the file's size")
        entries[key] = (dtype, shape, start, end)
    return entries, data_start
