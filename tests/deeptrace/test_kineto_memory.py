"""The Kineto reader streams: memory follows the GPU events kept, not the size of the file."""

import json
import tracemalloc
from pathlib import Path

import pytest
from deeptrace.kineto import read_kineto

from tests.deeptrace.kineto_builders import GEMM


def _trace(path: Path, cpu_ops: int, kernels: int = 2000) -> Path:
    """A Kineto trace of `kernels` kernels (with launches) and `cpu_ops` CPU operators, written event by event."""
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": [\n')
        for i in range(cpu_ops):
            args = {"External id": i, "Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float"] * 2}
            op = {
                "ph": "X",
                "cat": "cpu_op",
                "name": "aten::mm",
                "pid": 1,
                "tid": 1,
                "ts": 10 * i,
                "dur": 5,
                "args": args,
            }
            out.write(json.dumps(op) + ",\n")
        for i in range(kernels):
            out.write(json.dumps({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                                  "ts": 10 * i, "dur": 1, "args": {"correlation": 10**6 + i}}) + ",\n")  # fmt: skip
            out.write(json.dumps({"ph": "X", "cat": "kernel", "name": GEMM, "pid": 0, "tid": 7, "ts": 10 * i + 2,
                                  "dur": 5, "args": {"stream": 7, "correlation": 10**6 + i}}) + ",\n")  # fmt: skip
        out.write('{"ph": "i", "name": "end", "ts": 0}\n]}\n')
    return path


def _peak_bytes(path: Path) -> int:
    tracemalloc.start()
    try:
        table = read_kineto(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(table) == 2000
    return peak


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_events_that_are_not_kept(tmp_path: Path) -> None:
    small = _trace(tmp_path / "small.json", cpu_ops=2_000)
    large = _trace(tmp_path / "large.json", cpu_ops=60_000)
    assert large.stat().st_size > 10 * small.stat().st_size  # ~14 MB against ~1.3 MB
    peak_small, peak_large = _peak_bytes(small), _peak_bytes(large)
    # The same 2000 kernels are kept from both; 10 times more CPU operators (12 MB more JSON) cost nothing lasting:
    # the peak is the read buffer and one batch of decoded events, whatever the file size.
    assert peak_large < peak_small + 2 * 2**20
    assert peak_large < 16 * 2**20
