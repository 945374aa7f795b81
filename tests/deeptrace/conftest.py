"""The collector's two hot paths: the C contexts (deeptrace/collect/_hotpath.c) and the pure-Python ones.

The Python contexts are the reference the C ones must match: a collector behaviour test runs on both with
`pytestmark = pytest.mark.usefixtures("hot_path")` in its module; a test of the C path alone takes `native`.
"""

from __future__ import annotations

import shutil
from types import ModuleType

import pytest
from deeptrace.collect.native import HOT_PATH_ENV, native_module


def _built_native_module() -> ModuleType:
    """The C module; skips where no compiler could build it, fails where one exists and it was not built."""
    module = native_module()
    if module is None:
        if shutil.which("cc") is None:
            pytest.skip("deeptrace's C hot path is not built: this machine has no C compiler")
        pytest.fail("deeptrace's C hot path is not built although `cc` exists: reinstall deeptrace (uv sync)")
    return module


@pytest.fixture(params=["native", "python"])
def hot_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The hot path of the collectors this test makes (DEEPTRACE_HOT_PATH, read when a Collector is made)."""
    choice = str(request.param)
    if choice == "native":
        _built_native_module()
    monkeypatch.setenv(HOT_PATH_ENV, choice)
    return choice


@pytest.fixture
def native(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The C module, with DEEPTRACE_HOT_PATH unset (the default choice)."""
    module = _built_native_module()
    monkeypatch.delenv(HOT_PATH_ENV, raising=False)
    return module
