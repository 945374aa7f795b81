"""The in-process stack dump: every thread's Python stack, written by the rank itself when a signal arrives.

`deeptrace watch` reads a hung rank's stacks with py-spy where the kernel lets it attach (ptrace). Where it does
not (a container without CAP_SYS_PTRACE, a non-dumpable process, Yama's ptrace_scope), the rank answers itself:
the Collector registers faulthandler for a signal, and faulthandler writes the stacks from the C signal handler,
without the GIL, so it works even while the training thread is blocked inside a C call (a collective, a sleep).
The text is appended to RUN_DIR/stacks/rank-R.txt; the watcher notes the file's size, sends the signal and reads
what was added.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import warnings
from dataclasses import dataclass
from io import FileIO
from pathlib import Path

from deeptrace.rundir import layout

# SIGUSR2: PyTorch does not use it, while SIGUSR1 is what job schedulers are often told to send before a time
# limit (Slurm's --signal). A job that needs SIGUSR2 itself passes another signal, or None.
DEFAULT_STACK_SIGNAL: int | None = int(signal.SIGUSR2) if hasattr(signal, "SIGUSR2") else None


@dataclass
class StackDump:
    signal: int
    path: Path
    _file: FileIO

    @classmethod
    def install(cls, run_dir: Path, rank: int, signum: int | None) -> StackDump | None:
        """Register the dump; None (with a warning) where it cannot be, which never stops the job."""
        if signum is None or not hasattr(faulthandler, "register"):
            return None
        path = layout.stack_dump_path(run_dir, rank)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("ab", buffering=0)
            faulthandler.register(signum, file=handle, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError) as error:
            warnings.warn(f"deeptrace: no in-process stack dump on signal {signum}: {error!r}", stacklevel=3)
            return None
        return cls(signum, path, handle)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError, RuntimeError):
            faulthandler.unregister(self.signal)
        self._file.close()
