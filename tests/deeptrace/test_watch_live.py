"""`deeptrace watch` on real 4-rank gloo jobs with planted problems (watch_worker.py).

Each test starts the job and the watcher as real processes and checks what the watcher wrote: the verdict names
the culprit rank and the file:line where it waits within threshold + 15 s, by py-spy (as root) or by the
Collector's in-process dump where ptrace is refused (as `nobody`, the ranks non-dumpable); across two node
helpers standing for two nodes; and no alarm for a slow rank or a long announced checkpoint.
"""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import orjson
import pytest
from deeptrace.rundir import layout

from tests.deeptrace.watch_jobs import (
    DEEPTRACE,
    FAST,
    THRESHOLD_S,
    WORKER,
    marked_line,
    running,
    shared_run_dir,
    start,
    start_job,
    start_watch,
    started,
    wait_for,
    wait_for_verdict,
)

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]
NOBODY = 65534
START_TIMEOUT_S = 120.0  # four ranks importing torch on a loaded two-core machine
DEADLINE_S = THRESHOLD_S + 15.0


def once_watch(run: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*DEEPTRACE, "watch", str(run), *FAST, "--once"], capture_output=True, timeout=120, check=False
    )


class _Hook(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.received.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_rank_blocked_before_all_reduce_is_named_with_its_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alert = tmp_path / "alerted"
    on_hang = f"{sys.executable} -c 'import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])' {alert}"
    job = start_job(run, "block", culprit=2)
    watch = start_watch(run, "--on-hang", on_hang, "--webhook", f"http://127.0.0.1:{server.server_port}/hook")
    with running(job, watch):
        wait_for("the job to start", lambda: started(run), START_TIMEOUT_S, (job,))
        verdict, after_s = wait_for_verdict(run, 60, (job, watch))
        assert after_s <= DEADLINE_S, f"verdict {after_s:.1f} s after the hang began"
        assert verdict["culprit_ranks"] == [2]
        culprit = verdict["culprits"][0]
        assert culprit["where"] == f"{WORKER}:{marked_line('HANG-BLOCK')}"
        assert culprit["function"] == "wait_for_permission"
        assert verdict["waiting_ranks"] == [0, 1, 3]
        assert verdict["collective"] == {"group": "world", "seq": 3, "name": "all_reduce"}
        assert verdict["ranks"]["2"]["method"] == "py-spy"
        assert verdict["ranks"]["2"]["frozen_s"] is not None  # the same stack in all three snapshots
        # py-spy's native frames: the waiting ranks sit in gloo's C++ wait under torch's all_reduce.
        folder = layout.hang_dirs(run)[0]
        assert "c10d::" in (folder / "rank-0.txt").read_text()
        wait_for("the --on-hang command", alert.exists, 30)
        assert alert.read_text() == str(folder / "verdict.json")
        wait_for("the webhook", lambda: _Hook.received, 30)
        assert orjson.loads(_Hook.received[0])["culprit_ranks"] == [2]
        once = once_watch(run)
        assert once.returncode == 4, once.stdout + once.stderr
        analyze = subprocess.run([*DEEPTRACE, "analyze", str(run), "--json", "--no-png", "--stall-after", "3"],
                                 capture_output=True, timeout=120, check=True)  # fmt: skip
        report = orjson.loads(analyze.stdout)
        assert report["hang"]["culprit_ranks"] == [2]
        assert report["hang"]["watch"]["culprits"][0]["where"] == culprit["where"]
    server.shutdown()


# The job runs as `nobody` from this checkout's virtualenv: every folder above it must let other users through
# (a clone inside a `mktemp -d` folder, mode 0700, does not).
_CHECKOUT = Path(__file__).resolve().parents[2]
_OTHERS_CAN_ENTER = all(folder.stat().st_mode & 0o001 for folder in [_CHECKOUT, *_CHECKOUT.parents])


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or not _OTHERS_CAN_ENTER,
    reason="runs the job and the watcher as another user (needs root, setpriv, and a checkout others can enter)",
)
def test_rank_stuck_in_data_loading_is_named_where_ptrace_is_refused() -> None:
    run = shared_run_dir("nodump")
    try:
        job = start_job(run, "data", culprit=1, user=NOBODY, DEEPTRACE_TEST_NODUMP="1")
        watch = start_watch(run, user=NOBODY)
        with running(job, watch):
            wait_for("the job to start", lambda: started(run), START_TIMEOUT_S, (job,))
            verdict, after_s = wait_for_verdict(run, 60, (job, watch))
        assert after_s <= DEADLINE_S, f"verdict {after_s:.1f} s after the hang began"
        assert verdict["culprit_ranks"] == [1]
        assert verdict["culprits"][0]["where"] == f"{WORKER}:{marked_line('HANG-DATA')}"
        assert verdict["culprits"][0]["function"] == "load_batch"
        rank = verdict["ranks"]["1"]
        assert rank["method"] == "signal"
        assert any("py-spy cannot read" in note and "ermission" in note for note in rank["notes"]), rank["notes"]
    finally:
        shutil.rmtree(run.parent, ignore_errors=True)


def test_rank_missing_from_a_collective_is_named_across_two_node_helpers(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    job = start_job(run, "missing", culprit=2, hosts="node-a,node-a,node-b,node-b")
    helpers = [
        start([*DEEPTRACE, "watch", str(run), "--node"], tmp_path / f"helper-{host}.log", DEEPTRACE_HOST=host)
        for host in ("node-a", "node-b")
    ]
    watch = start_watch(run, DEEPTRACE_HOST="login-node")
    with running(job, watch, *helpers):
        wait_for("the job to start", lambda: started(run), START_TIMEOUT_S, (job,))
        verdict, after_s = wait_for_verdict(run, 60, (job, watch, *helpers))
    assert after_s <= DEADLINE_S, f"verdict {after_s:.1f} s after the hang began"
    assert verdict["culprit_ranks"] == [2]
    assert verdict["culprits"][0]["where"] == f"{WORKER}:{marked_line('SIDE-ALLREDUCE')}"
    assert verdict["odd_ranks"] == [2]
    assert verdict["wait_points"][f"rank_main ({WORKER}:{marked_line('ALLREDUCE')})"] == [0, 1, 3]
    assert all(verdict["ranks"][str(r)]["snapshots"] == 3 for r in range(4)), verdict["ranks"]
    assert "stack request" in (tmp_path / "helper-node-b.log").read_text()


def test_slow_rank_is_flagged_and_no_hang_raised(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    job = start_job(run, "slow", culprit=3)
    watch = start_watch(run)
    with running(job, watch):
        wait_for("the job to start", lambda: started(run, min_step=15), START_TIMEOUT_S, (job,))
        once = once_watch(run)
        assert once.returncode == 3, once.stdout + once.stderr
        assert b"rank 3 slow" in once.stdout
        (run / "stop").touch()  # the job runs until told: the check above needs it still running
        job.wait(timeout=120)
        watch.wait(timeout=60)
    log = (tmp_path / "run-watch.log").read_text()
    assert "rank 3 slow" in log
    assert watch.returncode == 0
    assert not layout.hang_dirs(run)
    assert "hung" not in log


def test_long_announced_checkpoint_raises_no_alarm(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    job = start_job(run, "checkpoint", culprit=0)
    watch = start_watch(run)
    with running(job, watch):
        wait_for("the checkpoint", (run / "planted").exists, START_TIMEOUT_S, (job,))
        time.sleep(THRESHOLD_S + 1)  # the checkpoint lasts 8 s: the others now wait longer than the threshold
        once = once_watch(run)
        assert once.returncode == 0, once.stdout + once.stderr
        assert b"in announced phase 'checkpoint'" in once.stdout, once.stdout
        job.wait(timeout=120)
        watch.wait(timeout=60)
    log = (tmp_path / "run-watch.log").read_text()
    assert "in announced phase 'checkpoint'" in log
    assert watch.returncode == 0
    assert not layout.hang_dirs(run)
    assert "stuck" not in log and "hung" not in log
