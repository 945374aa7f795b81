"""The processes of a job live and die together: the parent-death signal, and SIGTERM or SIGINT as a clean stop.

``xtrain train --nproc N`` is three generations of processes: the launcher (``xtrain``), torchrun's agent
(``python -m xtrain.train.torchrun``) and the ranks. torchrun starts each rank in a session of its own, so a
signal to the launcher's process group never reaches them, and when the agent dies they are re-parented to init
and would go on training and writing into the run directory. Here:

- **Each process below the launcher dies with its parent.** The agent and every rank ask the kernel, first thing,
  for SIGKILL when their parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux): the agent when the launcher dies, a
  rank when the agent dies, a background Hugging Face export when its rank dies, whatever killed the parent
  (SIGKILL and the OOM killer included). The parent may have died before the call: the process is told its
  parent's pid (``XTRAIN_PARENT_PID``) and exits at once if ``getppid()`` is no longer that pid. Where prctl
  does not exist, a thread polls ``getppid()`` every half second instead.
- **SIGTERM and SIGINT stop a rank cleanly.** torchrun's agent passes them on to the ranks (and SIGKILLs a rank
  still alive 30 s later); a rank raises :class:`StopRequested` in its main thread, so the loop ends where it is,
  the deeptrace collector records the end and the process exits with 128 + the signal. A save in flight is
  abandoned: only a save whose every file is written gets its ``COMPLETE`` marker (written last and atomically),
  so the folder is skipped on resume and the previous checkpoint stays the newest. A second signal, or a rank
  still alive :data:`STOP_GRACE_S` seconds later (a collective whose peer is gone), exits at once.

Ranks and background exports start through this module (``python -m xtrain.train.lifeline ARGS``, which then
runs ``xtrain ARGS``); ``xtrain train --nproc`` and ``checkpoint.hf_every_steps`` do so. Under a torchrun of your
own, ``torchrun ... -m xtrain.train.lifeline train CONFIG`` gives the ranks the same.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

PARENT_PID_ENV = "XTRAIN_PARENT_PID"
"""The pid of the process that started this one, set by that process: what ``getppid()`` must still be."""
STOP_GRACE_S = 20.0
"""How long a rank may take to stop after SIGTERM or SIGINT before it exits regardless (torchrun waits 30 s)."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h

log = logging.getLogger("xtrain")


class StopRequested(SystemExit):
    """SIGTERM or SIGINT reached a rank: the run stops here (exit code 128 + the signal's number)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __reduce__(self) -> tuple[type[StopRequested], tuple[int]]:
        return (StopRequested, (self.signum,))  # DCP pickles a rank's failure to its coordinator

    def __str__(self) -> str:
        return f"stopped by {signal.Signals(self.signum).name}"


def die_with_parent(parent_pid: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent dies; exit now if ``parent_pid`` (the parent this
    process was started by) is already gone."""
    if _set_parent_death_signal():
        if parent_pid is not None and os.getppid() != parent_pid:
            os._exit(128 + signal.SIGKILL)  # the parent died before the kernel was asked: as if the signal came
        return
    expected = os.getppid() if parent_pid is None else parent_pid
    threading.Thread(target=_watch_parent, args=(expected,), name="xtrain-parent-watch", daemon=True).start()


def die_with_parent_from_env() -> None:
    """:func:`die_with_parent` with the parent's pid from ``XTRAIN_PARENT_PID`` when this process was given one
    (without it, e.g. under a torchrun of your own, the signal is still set, with no check of a race)."""
    given = os.environ.get(PARENT_PID_ENV, "")
    die_with_parent(int(given) if given.isdigit() else None)


def _set_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(128 + signal.SIGKILL)


def stop_on_signals() -> None:
    """In a rank: SIGTERM and SIGINT raise :class:`StopRequested` in the main thread (once; a second one, or
    :data:`STOP_GRACE_S` seconds without an exit, ends the process at once)."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)


def _stop(signum: int, _frame: FrameType | None) -> None:
    for other in (signal.SIGTERM, signal.SIGINT):
        signal.signal(other, signal.SIG_DFL)
    timer = threading.Timer(STOP_GRACE_S, os._exit, args=(128 + signum,))
    timer.daemon = True
    timer.start()
    log.warning(
        "%s: stopping; a checkpoint save in flight is abandoned (no COMPLETE marker, resuming skips it)",
        signal.Signals(signum).name,
    )
    raise StopRequested(signum)


def main() -> None:
    """``python -m xtrain.train.lifeline ARGS``: ``xtrain ARGS``, bound to its parent (and, in a rank of a job,
    stopping cleanly on SIGTERM and SIGINT)."""
    die_with_parent_from_env()
    if "RANK" in os.environ:
        stop_on_signals()
    from xtrain.cli import main as xtrain_main  # noqa: PLC0415 (after the parent-death signal is set)

    xtrain_main(prog_name="xtrain")


if __name__ == "__main__":
    # Run the imported module, not this copy named __main__: the saver must catch the same StopRequested class.
    from xtrain.train.lifeline import main as imported_main

    imported_main()
