"""The collector's two hot paths: the C contexts (deeptrace/collect/_hotpath.c) and the pure-Python ones.

The Python contexts are the reference the C ones must match: a collector behaviour test runs on both with
`pytestmark = pytest.mark.usefixtures("hot_path")` in its module.
"""

from __future__ import annotations

import shutil

import pytest
from deeptrace.collect.native import HOT_PATH_ENV, native_module


@pytest.fixture(params=["native", "python"])
def hot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The hot path of the collectors this test makes (DEEPTRACE_HOT_PATH, read when a Collector is made)."""
    choice = str(request.param)
    if choice == "native" and native_module() is None:
        if shutil.which("cc") is None:
            pytest.skip("deeptrace's C hot path is not built: this machine has no C compiler")
        pytest.fail("deeptrace's C hot path is not built although `cc` exists: reinstall deeptrace (uv sync)")
    monkeypatch.setenv(HOT_PATH_ENV, choice)
    return choice
