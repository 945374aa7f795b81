"""`make demo`: train the tiny `debug` MoE model with `xtrain train` on two CPU processes, then analyse the run.

What runs: `xtrain train --nproc 2 examples/debug_moe.toml` (FSDP2 over a gloo process group, the chunked loss,
the global-batch load-balancing loss, the bundled sample documents tokenised with the bundled tokenizer and
packed), writing its run directory through deeptrace; then `deeptrace analyze` on that directory. The token cache
goes to runs/token-cache/ so a second demo reuses it.

The run directory is the demo's own (runs/demo by default): a previous demo's is replaced.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = REPO_ROOT / "examples" / "debug_moe.toml"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=REPO_ROOT / "runs" / "demo")
    parser.add_argument("--steps", type=int, help="train.max_steps [default: the config's]")
    parser.add_argument("--nproc", type=int, default=2)
    args = parser.parse_args()
    run_dir: Path = args.run_dir.resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    env = dict(os.environ)
    env.setdefault("XTRAIN_CACHE_DIR", str(REPO_ROOT / "runs" / "token-cache"))
    bin_dir = Path(sys.executable).parent
    train = [str(bin_dir / "xtrain"), "train", str(CONFIG), "--nproc", str(args.nproc), "--run-dir", str(run_dir)]
    if args.steps is not None:
        train += ["--set", f"train.max_steps={args.steps}"]
    print("$ xtrain " + " ".join(train[1:]).replace(str(REPO_ROOT) + "/", ""), flush=True)
    code = subprocess.call(train, env=env)
    if code != 0:
        return code
    analyze = [str(bin_dir / "deeptrace"), "analyze", str(run_dir)]
    shown = run_dir.relative_to(REPO_ROOT) if run_dir.is_relative_to(REPO_ROOT) else run_dir
    print(f"\n$ deeptrace analyze {shown}", flush=True)
    return subprocess.call(analyze, env=env)


if __name__ == "__main__":
    sys.exit(main())
