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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first. pytest-xdist hands tests to its workers in this order: the long multi-process and
    daemon tests then start at once, beside each other, and the many short ones fill the workers up at the end,
    instead of the last long test (collected last, from tests/integration or tests/tui) running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: otherwise collection order
