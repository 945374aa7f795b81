"""Fixtures shared by every test folder."""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Processes that tests spawn (torch.multiprocessing, start method "spawn") import their target function by module
# name, with the parent's sys.path. The `pytest` script, unlike `python -m pytest`, does not put the repository
# on sys.path, so without this every spawned rank fails to import `tests.*`.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
# Reference inputs that nobody on this project wrote; they lie beside the checkout, never inside it.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"reference data not found at {SHARED_DATA} (expected ../shared/data beside the checkout)")
    return SHARED_DATA
