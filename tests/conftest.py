"""Fixtures shared by every test folder."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# Reference inputs that nobody on this project wrote; they lie beside the checkout, never inside it.
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"reference data not found at {SHARED_DATA} (expected ../shared/data beside the checkout)")
    return SHARED_DATA
