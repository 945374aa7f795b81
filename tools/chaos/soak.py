"""Chaos soak: a training job submitted through clusterx meets many faults in a row and still ends exactly.

A job of examples/debug_moe.toml (2 processes, ``--steps`` optimizer steps, a checkpoint every 5 steps saved
asynchronously, a Hugging Face export beside each in the background, fp32 so that results are exact) is submitted to
clusterx's local backend with ``--max-retries 20`` and ``xtrain train --resume auto``. A seeded driver then kills
a random rank with SIGKILL ``--kills`` times at random moments, and the daemon once:

- a rank at a random moment after its target step (below);
- at least twice while an asynchronous save is in flight (a ``checkpoints/step-N`` folder without its
  ``COMPLETE`` marker, or the background writer's process alive);
- once while a background Hugging Face export runs (an ``xtrain export`` process of the job);
- once the clusterx daemon itself, with SIGKILL, while the job runs.

Each kill has a random target step (distinct, increasing, none in the last 6 steps) and waits until the attempt
then running has trained it, so that every attempt gets somewhere and the job cannot end before the last kill.
Beside it, the same training runs once undisturbed.

Pass: the job ends SUCCEEDED; every step's loss, router losses, gradient norm, learning rate and tokens equal the
undisturbed run's bit for bit; the final weights are bit-identical (each run directory's newest checkpoint
exported by ``xtrain export``, compared tensor by tensor); metrics.jsonl, as the typed reader takes it (a resumed
attempt's first record drops the steps after its checkpoint), holds every step exactly once; every background
export the kills cut is whole or absent; ``deeptrace analyze`` reads the run directory, every earlier attempt's
traces included, without an error and analyses the current attempt.

Prints one JSON line: ``kills``, ``attempts``, ``identical`` (bool), ``lost_steps``, ``duplicate_steps``, and the
details (``kill_kinds``, ``job_state``, ``weights_identical``, ``analyze_ok``, ``wall_s``); exits 1 when the job
did not pass. ``--ci`` is the short version the test suite runs (20 steps, 4 kills: a rank during a save, one
during an export, one at a random moment, and the daemon).

Usage: python tools/chaos/soak.py [--steps 60] [--kills 10] [--seed 0] [--workdir DIR] [--ci]

(``--kills`` counts the kills of a rank; the daemon's comes on top, so the default run kills 11 times.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from clusterx.daemon.control import daemon_pid
from clusterx.db.engine import resolve_db_url
from clusterx.glance import newest_jobs
from deeptrace.rundir import StepRecord, layout, read_metrics

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "debug_moe.toml"
BIN = Path(sys.executable).parent
EXACT_FIELDS = ("loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens")
CHECKPOINT_EVERY = 5
HF_EVERY = 5  # an export beside every checkpoint: each kill during an export has a chance to land before the end


@dataclass
class Job:
    """The job under test: its clusterx environment, id and run directory."""

    env: dict[str, str]
    run_dir: Path
    job_id: str = ""
    kills: list[str] = field(default_factory=list)
    seen: int = 0  # metrics.jsonl records logged before the last kill

    def clusterx(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "clusterx"), *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def processes(self, wanted: Callable[[psutil.Process], bool] = lambda _process: True) -> list[psutil.Process]:
        """The job's processes (they carry CLUSTERX_JOB_ID in their environment) for which `wanted` holds."""
        found = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("CLUSTERX_JOB_ID") == self.job_id and wanted(process):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def ranks(self) -> list[psutil.Process]:
        return self.processes(lambda process: "RANK" in process.environ() and "export" not in process.cmdline())

    def exports(self) -> list[psutil.Process]:
        return self.processes(lambda process: "export" in process.cmdline())

    def state(self) -> str:
        described = self.clusterx("describe", self.job_id, "--json")
        return str(json.loads(described.stdout)["state"]) if described.returncode == 0 else "UNKNOWN"


def settings(steps: int, cache: Path) -> list[str]:
    """``--set`` options: the soak's training (exact, short steps, saves and exports on a schedule)."""
    values = (
        f"train.max_steps={steps}", "train.global_batch=2", "data.pack_tokens=128", f"data.cache_dir={cache}",
        'parallel.mixed_precision="fp32"', "trace.profile_steps=[]", f"checkpoint.every_steps={CHECKPOINT_EVERY}",
        "checkpoint.async=true", f"checkpoint.hf_every_steps={HF_EVERY}", "checkpoint.keep=0",
        "eval.sources=[]", "eval.sample_prompts=[]",
    )  # fmt: skip
    return [arg for value in values for arg in ("--set", value)]


def environment(workdir: Path) -> dict[str, str]:
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "OMP_NUM_THREADS": "1",
        "CLUSTERX_DB": str(workdir / "clusterx.db"),
        "CLUSTERX_RUNS_DIR": str(workdir / "runs"),
        "CLUSTERX_DAEMON_IDLE_EXIT": "300",  # a daemon left behind by a crashed soak goes away by itself
    }


def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.05, job: Job | None = None) -> bool:
    """Poll ``predicate``; with ``job``, also stop (False) when the job has ended, asked only once a second (it is
    a ``clusterx describe``), so that a fast predicate is still polled often."""
    deadline = time.monotonic() + timeout_s
    next_state = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        if predicate():
            return True
        if job is not None and time.monotonic() >= next_state:
            if job_over(job):
                return False
            next_state = time.monotonic() + 1.0
        time.sleep(poll_s)
    return False


def save_in_flight(run_dir: Path) -> bool:
    """A checkpoint folder is being written: it exists without its completion marker."""
    checkpoints = run_dir / layout.CHECKPOINTS_DIR
    if not checkpoints.is_dir():
        return False
    return any(
        folder.name.startswith("step-") and not (folder / layout.CHECKPOINT_COMPLETE_MARKER).exists()
        for folder in checkpoints.iterdir()
    )


def kill_plan(rank_kills: int, steps: int, rng: random.Random) -> list[tuple[int, str]]:
    """Each kill's target step and kind, in order of the targets: `rank_kills` kills of a rank (two during a save,
    one in --ci; one during an export; the rest plain) and one of the daemon, shuffled. The targets are distinct
    random steps, none of them in the last CHECKPOINT_EVERY + 1 steps, so that a save and an export still follow
    the last of them and the job cannot end before it."""
    saves = 2 if rank_kills >= 5 else 1
    kinds = ["save"] * saves + ["export"]
    kinds += ["plain"] * max(0, rank_kills - len(kinds)) + ["daemon"]
    rng.shuffle(kinds)
    targets = sorted(rng.sample(range(2, steps - CHECKPOINT_EVERY), len(kinds)))
    return list(zip(targets, kinds, strict=True))


def attempt_reached(run_dir: Path, seen: int, target: int) -> bool:
    """The attempt now running has logged a step >= target: a record after the first `seen` of metrics.jsonl
    (those logged before the previous kill) says so."""
    return any(record.step >= target for record in read_metrics(run_dir)[seen:])


def one_kill(job: Job, target: int, kind: str, rng: random.Random) -> bool:
    """Wait until the attempt now running has trained step `target`, then for the moment the kind asks for, then
    kill. False when the job finished first."""
    if not wait_for(lambda: attempt_reached(job.run_dir, job.seen, target), 600, 0.1, job):
        return False
    if kind == "daemon":
        daemon = daemon_process(job)
        if daemon is None:
            return False
        daemon.send_signal(signal.SIGKILL)
        job.kills.append("daemon")
        time.sleep(rng.uniform(0.5, 2.0))
        job.clusterx("daemon", "start")  # what the next clusterx command would do; the job is adopted
        job.seen = len(read_metrics(job.run_dir))
        return True
    ranks = job.ranks()  # found before the moment: the kill then lands within a poll of it
    moment: Callable[[], bool]
    if kind == "save":
        moment = lambda: save_in_flight(job.run_dir)  # noqa: E731
    elif kind == "export":
        moment = lambda: bool(job.exports())  # noqa: E731
    else:
        delay = time.monotonic() + rng.uniform(0.0, 0.5)
        moment = lambda: time.monotonic() >= delay  # noqa: E731

    # A save or an export is over in a fraction of a second; on a loaded machine every poll of one save
    # window may miss it. Once the attempt has trained past a whole window (a save and an export are
    # due at every CHECKPOINT_EVERY-th step), the kill lands anyway, counted as late, rather than waiting for
    # a window that may never come before the job ends.
    def moment_or_window_passed() -> bool:
        return moment() or attempt_reached(job.run_dir, job.seen, target + CHECKPOINT_EVERY - 1)

    if not wait_for(moment_or_window_passed, 300, 0.002, job):
        return False
    landed = save_in_flight(job.run_dir) if kind == "save" else bool(job.exports()) if kind == "export" else True
    try:
        rng.choice(ranks).send_signal(signal.SIGKILL)
    except (psutil.NoSuchProcess, IndexError):
        return False
    job.kills.append(kind if landed else f"{kind}-late")
    # Wait for this attempt's ranks to be gone, then count what the dead attempt logged, so that the next kill
    # waits for the next attempt's own steps. Its own ranks, by process: the next attempt's may already be
    # running (clusterx retries at once), and waiting for the job to have no ranks at all then waited until
    # that attempt had trained to the end, leaving the next kill nothing to wait for.
    psutil.wait_procs(ranks, timeout=120)
    job.seen = len(read_metrics(job.run_dir))
    return True


def job_over(job: Job) -> bool:
    """Whether the job has ended, read from its SQLite history with the standard library (clusterx.glance), or
    through `clusterx describe` when that cannot be read now. A describe is a new Python process: on a loaded
    machine it took seconds, during which the kills' polls did not run and the attempt trained on past the
    moments they wait for (a kill then landed many steps late, and the job could end before the last one)."""
    glances = newest_jobs(job.env["CLUSTERX_DB"], 10)
    mine = [glance for glance in glances or [] if str(glance.id) == job.job_id]
    state = mine[0].state if mine else job.state()
    return state in {"SUCCEEDED", "FAILED", "CANCELLED", "LOST"}


def daemon_process(job: Job) -> psutil.Process | None:
    """The job database's daemon, by the pid it writes into its lock file (clusterx's own lookup)."""
    pid = daemon_pid(resolve_db_url(job.env["CLUSTERX_DB"]))
    if pid is None or pid <= 0:
        return None
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def surviving_records(records: list[StepRecord]) -> tuple[dict[int, StepRecord], list[int]]:
    """The records the typed reader keeps (a resumed attempt's first record drops the steps after its
    checkpoint), one per step, and the steps logged twice within one attempt (duplicates)."""
    kept: dict[int, StepRecord] = {}
    duplicates: list[int] = []
    for record in records:
        if record.resumed_from_step is not None:
            kept = {step: r for step, r in kept.items() if step <= record.resumed_from_step}
        if record.step in kept:
            duplicates.append(record.step)
        kept[record.step] = record
    return kept, duplicates


def weights_identical(ours: Path, theirs: Path) -> bool:
    """Every tensor of two Hugging Face folders equal bit for bit (same names, shapes, dtypes and bytes)."""
    from safetensors.torch import load_file

    def tensors(folder: Path) -> dict[str, object]:
        loaded: dict[str, object] = {}
        for file in sorted(folder.glob("*.safetensors")):
            loaded.update(load_file(file))
        return loaded

    a, b = tensors(ours), tensors(theirs)
    return bool(a) and a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)  # type: ignore[attr-defined]


def final_weights_identical(ours: Path, theirs: Path, workdir: Path, env: dict[str, str]) -> bool:
    """The newest complete checkpoint of each run directory exported by ``xtrain export``, compared tensor by
    tensor."""
    folders = []
    for name, run_dir in (("ours", ours), ("theirs", theirs)):
        out = workdir / f"final-{name}"
        done = subprocess.run([str(BIN / "xtrain"), "export", str(run_dir), str(out)], env=env, capture_output=True,
                              text=True, timeout=600, check=False)  # fmt: skip
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return False
        folders.append(out)
    return weights_identical(folders[0], folders[1])


def hf_exports_whole(run_dir: Path) -> bool:
    """Every background export the kills may have cut is whole or absent: each hf/step-N has its config and
    weights (an export writes into a temporary folder renamed at the end)."""
    hf = run_dir / layout.HF_DIR
    folders = [folder for folder in hf.iterdir() if folder.name.startswith("step-")] if hf.is_dir() else []
    return all((f / "config.json").is_file() and any(f.glob("*.safetensors")) for f in folders)


def analyze(run_dir: Path, env: dict[str, str], attempts: int) -> dict[str, object]:
    """``deeptrace analyze`` of the soaked run directory: it must exit 0, analyse both ranks' current traces and
    list the earlier attempts' traces it set aside."""
    done = subprocess.run(
        [str(BIN / "deeptrace"), "analyze", str(run_dir), "--json", "--no-png", "-j", "1"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return {"analyze_ok": False, "analyze_rc": done.returncode}
    report = json.loads(done.stdout)
    earlier = len(report.get("earlier_attempts", []))
    unread = [entry["path"] for entry in report.get("inputs", []) if entry.get("error")]
    ok = sorted(report.get("ranks", {})) == ["0", "1"] and (attempts <= 1 or earlier > 0)
    return {"analyze_ok": ok, "earlier_attempt_traces": earlier, "inputs_not_used": unread}


def soak(args: argparse.Namespace, workdir: Path) -> dict[str, object]:
    rng = random.Random(args.seed)
    started = time.monotonic()
    options = settings(args.steps, workdir / "cache")
    reference = workdir / "reference"
    env = environment(workdir)
    command = [str(BIN / "xtrain"), "train", str(CONFIG), "--nproc", "2"]
    undisturbed = subprocess.run([*command, "--run-dir", str(reference), *options], env=env, cwd=workdir,
                                 capture_output=True, text=True, timeout=1800, check=False)  # fmt: skip
    if undisturbed.returncode != 0:
        raise RuntimeError(f"the undisturbed run failed:\n{undisturbed.stderr[-3000:]}")
    job = Job(env, workdir / "job")
    submitted = job.clusterx("submit", "--json", "--name", "chaos-soak", "--procs-per-node", "2",
                             "--max-retries", "20", "--run-dir", str(job.run_dir), "--workdir", str(workdir),
                             "--", *command, "--resume", "auto", *options)  # fmt: skip
    if submitted.returncode != 0:
        raise RuntimeError(f"submit failed: {submitted.stderr}")
    job.job_id = str(json.loads(submitted.stdout)["id"])
    try:
        for target, kind in kill_plan(args.kills, args.steps, rng):
            if not one_kill(job, target, kind, rng):
                break
        waited = job.clusterx("wait", job.job_id, "--timeout", "1800", timeout=1900)
        described = json.loads(job.clusterx("describe", job.job_id, "--json").stdout)
    finally:
        job.clusterx("cancel", job.job_id, "--yes")
        job.clusterx("daemon", "stop")
    kept, duplicates = surviving_records(read_metrics(job.run_dir))
    theirs = {record.step: record for record in read_metrics(reference)}
    lost = sorted(set(range(1, args.steps + 1)) - set(kept))
    steps_equal = all(
        step in kept and all(getattr(kept[step], name) == getattr(record, name) for name in EXACT_FIELDS)
        for step, record in theirs.items()
    )
    weights = final_weights_identical(job.run_dir, reference, workdir, env)
    state = str(described["state"])
    return {
        "kills": len(job.kills),
        "attempts": len(described.get("attempts", [])),
        "identical": steps_equal and weights and state == "SUCCEEDED",
        "lost_steps": len(lost),
        "duplicate_steps": len(duplicates),
        "kill_kinds": job.kills,
        "job_state": state,
        "wait_rc": waited.returncode,
        "weights_identical": weights,
        "hf_exports_whole": hf_exports_whole(job.run_dir),
        "steps_identical": steps_equal,
        **analyze(job.run_dir, env, len(described.get("attempts", []))),
        "steps": args.steps,
        "seed": args.seed,
        "wall_s": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--kills", type=int, default=10, help="kills of a rank (the daemon's one comes on top)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, help="keep everything here (default: a temporary folder)")
    parser.add_argument("--ci", action="store_true", help="the short version: 20 steps, 3 rank kills")
    args = parser.parse_args()
    if args.ci:
        args.steps, args.kills = 20, 3
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = soak(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="xtrain-soak-") as tmp:
            result = soak(args, Path(tmp))
    print(json.dumps(result), flush=True)
    passed = result["identical"] and not result["lost_steps"] and not result["duplicate_steps"]
    passed = passed and result["analyze_ok"] and result["hf_exports_whole"]
    return 0 if passed and result["kills"] == args.kills + 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
