import os
import shutil
import subprocess

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio; the anyio pytest plugin runs the async tests on it."""
    return "asyncio"


@pytest.fixture(scope="session")
def tmux() -> str:
    """The tmux binary: a real terminal for the dashboard. Installed from Debian's packages when missing (as root)."""
    found = shutil.which("tmux")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True, timeout=300)
        subprocess.run(["apt-get", "install", "-y", "-qq", "tmux"], check=False, capture_output=True, timeout=300)
        found = shutil.which("tmux")
    if found is None:
        pytest.skip("tmux is not installed and cannot be installed here (not root, or no apt-get)")
    return found
