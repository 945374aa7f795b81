"""Telling someone about a hang: a command with the verdict file as its argument, or a JSON POST to a webhook.

Both are best effort: a failing alert is reported and the watch goes on (it must not die of a bad URL).
"""

from __future__ import annotations

import shlex
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from deeptrace.rundir.jsonio import dumps

ALERT_TIMEOUT_S = 30.0


def run_on_hang(command: str, verdict_path: Path) -> str | None:
    """Run COMMAND VERDICT_PATH; None when it succeeded, else what went wrong."""
    try:
        done = subprocess.run(
            [*shlex.split(command), str(verdict_path)], timeout=ALERT_TIMEOUT_S, check=False, capture_output=True
        )
    except (OSError, ValueError, subprocess.TimeoutExpired) as error:
        return f"--on-hang {command!r} failed: {error}"
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return f"--on-hang {command!r} exited {done.returncode} {tail[0]}".rstrip()
    return None


def post_webhook(url: str, verdict: dict[str, Any]) -> str | None:
    """POST the verdict as JSON; None on a 2xx answer, else what went wrong."""
    request = urllib.request.Request(
        url, data=dumps(verdict), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=ALERT_TIMEOUT_S) as answer:  # the user's URL
            status = int(answer.status)
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"--webhook {url}: {error}"
    return None if 200 <= status < 300 else f"--webhook {url}: HTTP {status}"
