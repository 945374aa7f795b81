"""Installing the system packages a test fixture needs (Slurm, PostgreSQL, tmux) from Debian's packages.

CI runs as root on a fresh clone; what the machine lacks is installed here, by the fixtures, not by hand.
"""

import os
import shutil
import subprocess

import pytest

# Another process (a second xdist worker, another session) may hold the dpkg lock: wait for it instead of failing.
_LOCK_WAIT = ["-o", "DPkg::Lock::Timeout=300"]


def apt_install(*packages: str) -> None:
    """`apt-get update` then `apt-get install -y PACKAGES`; skips the test when not root, fails with apt's output."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"{', '.join(packages)} missing, and installing needs root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", *_LOCK_WAIT, "update"], ["apt-get", *_LOCK_WAIT, "install", "-y", *packages]):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
