"""Losses of examples/debug_moe.toml (2 processes, 10 steps) as the trainer gave them before it was rebuilt from
components (issue 20), kept in fixtures/losses_before_trainer_components.json and compared by
test_losses_unchanged.py. Three settings: the example as it is, ``parallel.ep_size = 2``, and
``memory.checkpointing = "full"`` with activation offload.

Recorded once with the code before that change (``python -m tests.engine.train.loss_fixtures --record``); a later
re-recording would compare the code with itself, which is why the file says which commit recorded it.

Bit for bit holds only on one kind of CPU: MKL and oneDNN pick their kernels by the instruction sets there are
(AVX2, AVX-512, AMX), and those round differently. So MACHINE_FIXTURES holds, per CPU signature
(``machine_signature``), the same three runs made with the code of that same commit on such a CPU (a worktree
of the commit on PYTHONPATH); where the signature has none, the runs are compared with the original fixture to
a relative 1e-4.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.engine.checkpoint.cli_runs import DEBUG_CONFIG, metrics, xtrain

FIXTURE = Path(__file__).parent / "fixtures" / "losses_before_trainer_components.json"
MACHINE_FIXTURES = Path(__file__).parent / "fixtures" / "losses_before_trainer_components.machines.json"
# The instruction sets whose presence changes which BLAS and oneDNN kernels run, and so their rounding.
_KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "avx_vnni")
KEYS = ("loss", "aux_loss", "z_loss", "grad_norm", "lr", "tokens")
STEPS = 10

SETTINGS: dict[str, tuple[str, ...]] = {
    "default": (),
    "ep_size_2": ("parallel.ep_size=2",),
    "full_checkpointing_offload": ('memory.checkpointing="full"', "memory.offload=true"),
}


def run_setting(name: str, root: Path) -> list[dict[str, float]]:
    """Train one setting through the real command line in 2 processes; its records, step by step."""
    run_dir = root / name
    overrides = (f"train.max_steps={STEPS}", f"data.cache_dir={root / 'cache'}", "trace.profile_steps=[]")
    args = [arg for setting in (*overrides, *SETTINGS[name]) for arg in ("--set", setting)]
    done = xtrain("train", DEBUG_CONFIG, "--nproc", "2", "--run-dir", run_dir, *args, cwd=root)
    if done.returncode != 0:
        raise AssertionError(f"{name}: xtrain train failed\n{done.stdout}\n{done.stderr}")
    return [{key: record[key] for key in KEYS} for record in metrics(run_dir)]


def machine_signature() -> str:
    """The CPU as the kernels see it: torch's CPU capability and the instruction sets of _KERNEL_FLAGS there are."""
    import torch

    flags: set[str] = set()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    present = [flag for flag in _KERNEL_FLAGS if flag in flags]
    return "+".join([torch.backends.cpu.get_cpu_capability(), *present])


def recorded_for_this_machine() -> dict[str, list[dict[str, float]]] | None:
    """This CPU's runs from the commit before the change, None when no run was recorded on such a CPU."""
    if not MACHINE_FIXTURES.is_file():
        return None
    entry = json.loads(MACHINE_FIXTURES.read_text()).get(machine_signature())
    return None if entry is None else entry["runs"]


def main() -> None:
    import tempfile

    if sys.argv[1:] != ["--record"]:
        raise SystemExit("usage: python -m tests.engine.train.loss_fixtures --record")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: run_setting(name, Path(tmp)) for name in SETTINGS}
    FIXTURE.write_text(json.dumps({"recorded_at_commit": commit, "steps": STEPS, "runs": runs}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
