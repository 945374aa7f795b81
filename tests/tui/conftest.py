import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Textual runs on asyncio; the anyio pytest plugin runs the async tests on it."""
    return "asyncio"
