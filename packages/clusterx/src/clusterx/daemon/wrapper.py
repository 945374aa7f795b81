"""The tiny process the daemon starts for each attempt: it runs the job's command and writes its exit status to
a file, so that a job that ends while the daemon is down still gets its true end state.

Run as `python -I wrapper.py ATTEMPT_DIR -- ARGV...` (stdlib only, isolated mode). It leads the job's process
group; a SIGTERM sent to the group reaches the job, and the wrapper stays to record how the job ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

EXIT_FILE = "exit.json"
PID_FILE = "wrapper.json"


# Run in isolated mode (no PYTHONPATH): clusterx is imported from the folder this file lives in, the very copy the
# daemon runs, whether it is installed or not. clusterx.fileio is stdlib only, as this process must stay.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from clusterx.fileio import write_atomically  # noqa: E402


def write_json(path: Path, data: dict[str, object]) -> None:
    write_atomically(path, json.dumps(data))


def main(argv: list[str]) -> int:
    attempt_dir = Path(argv[0])
    command = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    write_json(attempt_dir / PID_FILE, {"pid": os.getpid(), "pgid": os.getpgid(0), "started": time.time()})
    # The group's SIGTERM is for the job; the wrapper outlives it to write the exit status. A handler (not
    # SIG_IGN, which exec would pass on) so that the job itself keeps the default action.
    signal.signal(signal.SIGTERM, _note_signal)
    signal.signal(signal.SIGINT, _note_signal)
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        reason = f"cannot run {command[0]!r}: {exc.strerror}"
        write_json(attempt_dir / EXIT_FILE, {"returncode": 127, "reason": reason, "ended": time.time()})
        print(f"clusterx: {reason}", file=sys.stderr)
        return 127
    returncode = child.wait()
    write_json(attempt_dir / EXIT_FILE, {"returncode": returncode, "ended": time.time()})
    return returncode if returncode >= 0 else 128 - returncode


def _note_signal(signum: int, _frame: object) -> None:
    """Nothing to do: the job got the same signal, and its exit status tells the rest."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
