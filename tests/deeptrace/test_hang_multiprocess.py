"""A real hang: four processes train with the Collector and a file barrier; one blocks before the barrier."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from deeptrace.analysis.hang import diagnose_hang
from deeptrace.report.model import HangCollective
from deeptrace.rundir import Heartbeat, read_heartbeats

WORLD = 4
STUCK_RANK = 2
STUCK_STEP = 3

# Each rank: compute, then a barrier-like collective (every rank drops a file and waits for all the others').
# The stuck rank blocks forever in its compute of STUCK_STEP, so it never enters that step's barrier.
WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from deeptrace.collect import Collector
    from deeptrace.spans import Category

    run_dir, rank, world, stuck_rank, stuck_step = Path(sys.argv[1]), *map(int, sys.argv[2:])
    barrier = run_dir / "barrier"
    with Collector(run_dir, rank, world, heartbeat_interval_s=0.1) as collector:
        for step in range(1000):
            collector.step_begin(step)
            with collector.span("forward", Category.COMPUTE):
                if rank == stuck_rank and step == stuck_step:
                    while True:
                        time.sleep(1)
                time.sleep(0.01)
            with collector.collective("barrier", group="world"):
                (barrier / f"{step}-{rank}").touch()
                while not all((barrier / f"{step}-{r}").exists() for r in range(world)):
                    time.sleep(0.005)
            collector.step_end(step)
    """
)


def _all_waiting(beats: dict[int, Heartbeat]) -> bool:
    others = [r for r in range(WORLD) if r != STUCK_RANK]
    return all(
        r in beats and (c := beats[r].in_collective) is not None and c.seq == STUCK_STEP and c.group == "world"
        for r in others
    )


@pytest.mark.multiprocess
@pytest.mark.slow
def test_diagnosis_names_the_rank_that_never_reached_the_barrier(tmp_path: Path) -> None:
    (tmp_path / "barrier").mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), str(rank), str(WORLD), str(STUCK_RANK), str(STUCK_STEP)]
        )
        for rank in range(WORLD)
    ]
    try:
        deadline = time.monotonic() + 60
        while not _all_waiting(read_heartbeats(tmp_path, errors={})):
            assert time.monotonic() < deadline, "the ranks never reached the planted hang"
            assert all(p.poll() is None for p in procs), "a worker exited early"
            time.sleep(0.05)
        time.sleep(1.5)

        # While they hang: every rank alive (heartbeats fresh, rewritten every 0.1 s) but idle for over a second.
        live = diagnose_hang(tmp_path, stall_after_s=1.0)
        assert live is not None, "no hang diagnosed"
        assert live.culprit_ranks == [STUCK_RANK]
        assert live.waiting_ranks == [r for r in range(WORLD) if r != STUCK_RANK]
        assert live.collective == HangCollective(group="world", seq=STUCK_STEP, name="barrier")
        assert {s.status for s in live.ranks.values()} == {"stalled"}
        assert live.ranks[STUCK_RANK].step == STUCK_STEP
        assert live.ranks[STUCK_RANK].open_span == "'forward' (compute)"
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait(timeout=30)

    # After the kill: the heartbeats stop being rewritten, the processes are gone; the answer stays.
    time.sleep(0.6)
    dead = diagnose_hang(tmp_path, stall_after_s=0.5)
    assert dead is not None
    assert dead.culprit_ranks == [STUCK_RANK]
    assert {s.status for s in dead.ranks.values()} == {"gone"}
