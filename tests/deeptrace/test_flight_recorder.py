"""PyTorch Flight Recorder dumps, real ones: torch 2.13 records gloo collectives with TORCH_FR_BUFFER_SIZE."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from deeptrace.analysis.flight_recorder import analyse_flight_recorder

WORKER = Path(__file__).with_name("fr_worker.py")
DEEPTRACE = str(Path(sys.executable).with_name("deeptrace"))


def _line(marker: str) -> int:
    return next(n for n, line in enumerate(WORKER.read_text().splitlines(), 1) if line.rstrip().endswith(f"# {marker}"))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_analyze_reports_the_first_collective_at_which_ranks_disagree(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(WORKER), str(tmp_path)], check=True, timeout=300)
    done = subprocess.run([DEEPTRACE, "analyze", str(tmp_path), "--json", "--no-png"], capture_output=True,
                          timeout=120, check=True)  # fmt: skip
    flight = orjson.loads(done.stdout)["flight_recorder"]
    assert flight["ranks"] == [0, 1, 2]
    first = flight["first_disagreement"]
    # Rank 1 skipped one all-reduce, so gloo paired its later ones with the others' earlier ones: it issued 4,
    # the others 5, and they wait in the 5th.
    assert (first["group"], first["seq"], first["kind"], first["culprit_ranks"]) == ("0/default_pg", 5, "missing", [1])
    assert first["per_rank"]["1"] == "never issued it (its last seq in this group: 4)"
    assert first["per_rank"]["0"].startswith("gloo:all_reduce [[8]]")
    assert first["issued_at"] == f"rank_main ({WORKER}:{_line('ISSUED')})"


class Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("code ran",))


def test_a_dump_that_names_a_class_is_refused_not_run(tmp_path: Path) -> None:
    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    (folder / "rank_0").write_bytes(pickle.dumps({"entries": [Payload()]}))
    warnings: list[str] = []
    found = analyse_flight_recorder(tmp_path, warnings.append)
    assert found is not None and found["ranks"] == []
    assert len(warnings) == 1
    assert "rank_0: not a Flight Recorder dump (refusing builtins.print" in warnings[0]
