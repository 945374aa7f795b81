"""Submitting through the running daemon: the quick way for `clusterx submit` on the local backend.

The command line reads its options and spec file into a plain mapping (no pydantic, no SQLAlchemy) and sends
it over the daemon's Unix socket; the daemon, which has everything loaded already, validates and stores the
job exactly as `Client.submit` does (it calls it) and answers with the job record. So a submit costs an
interpreter start plus a round trip, not the import of the whole stack.

Only the daemon's own user may submit through its socket (checked with SO_PEERCRED; the socket is mode 600):
the daemon runs jobs as itself.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

from clusterx.paths import lock_path

UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux; keep a margin


def socket_path(url: str) -> Path:
    path = lock_path(url).with_suffix(".sock")
    if len(str(path)) <= UNIX_PATH_MAX:
        return path
    return Path(tempfile.gettempdir()) / f"clusterx-{os.getuid()}" / f"{zlib.crc32(url.encode()):08x}.sock"


def submit_via_daemon(
    url: str, mapping: dict[str, Any], source: str, runs_dir: str | None, timeout_s: float = 30.0
) -> dict[str, Any] | None:
    """The new job's record; None when no daemon listens (the caller then submits in-process).
    A user error found by the daemon comes back as ClusterxError with the daemon's message."""
    path = socket_path(url)
    if not path.exists():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # a stale socket of a daemon that died
        request = {"op": "submit", "spec": mapping, "source": source, "runs_dir": runs_dir}
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply = _read_line(sock)
    if not reply:
        return None
    answer = json.loads(reply)
    if not answer["ok"]:
        from clusterx.errors import ClusterxError  # noqa: PLC0415 (only on errors)

        raise ClusterxError(answer["error"])
    record: dict[str, Any] = answer["record"]
    return record


def _read_line(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            break
    return b"".join(chunks)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
