"""Which hot path a collector records with: the C contexts of `_hotpath` or the pure-Python ones of contexts.py.

The C module is built by the package's build hook (packages/deeptrace/hatch_build.py) where a C compiler exists;
both record the same spans, collectives and heartbeat marks, the C one at a fraction of the cost per span
(docs/benchmarks.md). DEEPTRACE_HOT_PATH chooses: `native` (fail if it is not built), `python`, or unset (native
where built). Each Collector reads it once, when it is made.
"""

from __future__ import annotations

import os
from types import ModuleType

HOT_PATH_ENV = "DEEPTRACE_HOT_PATH"
HOT_PATH_CHOICES = ("native", "python")

_native: ModuleType | None
try:
    from deeptrace.collect import _hotpath as _native
except ImportError:  # not built: no C compiler at install time, or DEEPTRACE_NO_NATIVE=1
    _native = None


def native_module() -> ModuleType | None:
    """The built C module, None where it is not built."""
    return _native


def native_chosen() -> bool:
    """Whether a collector made now records with the C contexts (DEEPTRACE_HOT_PATH, else where built)."""
    choice = os.environ.get(HOT_PATH_ENV, "")
    if choice == "":
        return _native is not None
    if choice not in HOT_PATH_CHOICES:
        raise ValueError(f"{HOT_PATH_ENV}={choice!r}: use one of {list(HOT_PATH_CHOICES)} or leave it unset")
    if choice == "native" and _native is None:
        raise ValueError(
            f"{HOT_PATH_ENV}=native, but deeptrace's C hot path is not built (no C compiler when it was installed, "
            "or DEEPTRACE_NO_NATIVE=1): reinstall deeptrace where `cc` works, or unset it"
        )
    return choice == "native"
