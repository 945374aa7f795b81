import shutil

import pytest

from tests.debian_packages import apt_install


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio; the anyio pytest plugin runs the async tests on it."""
    return "asyncio"


@pytest.fixture(scope="session")
def tmux() -> str:
    """The tmux binary: a real terminal for the dashboard. Installed from Debian's packages when missing (as root)."""
    found = shutil.which("tmux")
    if found is None:
        apt_install("tmux")
        found = shutil.which("tmux")
    if found is None:
        pytest.fail("apt-get installed tmux, yet it is not on PATH")
    return found
