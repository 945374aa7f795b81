"""Talking to the running daemon over its Unix socket: the quick way for `clusterx submit` on a daemon backend,
and the way cancel and retry of its jobs are asked for.

The command line reads its options and spec file into a plain mapping (no pydantic, no SQLAlchemy) and sends
it over the daemon's socket; the daemon, which has everything loaded already, validates and stores the job
exactly as `Client.submit` does (it calls it) and answers with the job record. So a submit costs an
interpreter start plus a round trip, not the import of the whole stack.

The daemon identifies the caller of every request by the socket's peer credentials (SO_PEERCRED, set by the
kernel: it cannot be forged); see clusterx.daemon.api for what each user may ask.

When the daemon cannot be reached, the caller submits in-process. That is the normal way when no daemon runs
(the first submit starts it); when one runs but did not answer, `Unreachable.daemon_pid` says so and the command
line warns, because that submit is slow for a reason the user should know. The messages themselves are the
typed ones of clusterx.daemon.messages.
"""

from __future__ import annotations

import os
import socket
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from clusterx.daemon.messages import (
    ErrorReply,
    MessageError,
    R,
    RecordReply,
    Request,
    SubmitRequest,
    decode_reply,
    encode,
)
from clusterx.paths import lock_path

UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux; keep a margin
# A daemon holding its lock but not yet listening is starting (it listens before it writes its pid): wait this
# long for it rather than paying the slow path.
STARTING_WAIT_S = 5.0


def socket_path(url: str) -> Path:
    path = lock_path(url).with_suffix(".sock")
    if len(str(path)) <= UNIX_PATH_MAX:
        return path
    return Path(tempfile.gettempdir()) / f"clusterx-{os.getuid()}" / f"{zlib.crc32(url.encode()):08x}.sock"


@dataclass(frozen=True)
class Unreachable:
    """Why a request did not go through the daemon. `daemon_pid` is set when a daemon runs all the same."""

    reason: str
    daemon_pid: int | None = None


def request_daemon(url: str, request: Request, expected: type[R], timeout_s: float = 30.0) -> R | Unreachable:
    """The daemon's answer to one request, or why it could not be asked. A refusal is raised as the error the
    daemon raised (NotOwnerError, JobNotFoundError, ...), with its message."""
    path = socket_path(url)
    answer = _ask(path, request, expected, timeout_s) if path.exists() else Unreachable("gone")
    if not isinstance(answer, Unreachable):
        return answer
    # The slow paths only: `control` imports subprocess, a cost the quick way does not pay.
    from clusterx.daemon.control import daemon_pid  # noqa: PLC0415

    if answer.reason == "gone":
        deadline = time.monotonic() + STARTING_WAIT_S
        while (pid := daemon_pid(url)) == -1 and not path.exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # the daemon holds its lock and sets up; it listens before it writes its pid
        if pid is None:
            return Unreachable("no daemon runs")
        if path.exists():
            answer = _ask(path, request, expected, timeout_s)
            if not isinstance(answer, Unreachable):
                return answer
    # A daemon that wrote its pid listens already: a missing socket was removed under it.
    reason = f"its socket {path} is missing" if answer.reason == "gone" else answer.reason
    return Unreachable(reason, daemon_pid(url))


def _ask(path: Path, request: Request, expected: type[R], timeout_s: float) -> R | Unreachable:
    """One round trip; Unreachable("gone") when the socket vanished before the connect (a daemon that exited)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(encode(request))
            line = read_line(sock)
    except FileNotFoundError:
        return Unreachable("gone")
    except TimeoutError:
        return Unreachable(f"it did not answer on {path} within {timeout_s:g} s")
    except OSError as exc:  # refused (a stale socket of a daemon that died), reset, permission denied
        return Unreachable(f"{path}: {exc.strerror or exc}")
    if not line:
        return Unreachable(f"it closed {path} without an answer")
    try:
        reply = decode_reply(line, expected)
    except MessageError as exc:  # a daemon of another version: the caller does the work itself, as without one
        return Unreachable(f"its answer on {path} was not understood: {exc}")
    if isinstance(reply, ErrorReply):
        raise_refusal(reply)
    return reply


def submit_via_daemon(
    url: str, mapping: dict[str, Any], source: str, runs_dir: str | None, timeout_s: float = 30.0
) -> RecordReply | Unreachable:
    """The new job's record, or why the daemon could not take it (the caller then submits in-process).
    A user error found by the daemon comes back as ClusterxError with the daemon's message.

    `mapping` must carry a submit_key: a submit that falls back after a timeout then returns the job the daemon
    may have stored meanwhile instead of storing it twice."""
    return request_daemon(url, SubmitRequest(mapping, source, runs_dir), RecordReply, timeout_s)


def raise_refusal(reply: ErrorReply) -> NoReturn:
    """Raise a refusal as the error the daemon raised (NotOwnerError, JobNotFoundError, ...), with its message."""
    from clusterx import errors  # noqa: PLC0415 (only on errors)

    kind = getattr(errors, reply.kind, errors.ClusterxError)
    if not (isinstance(kind, type) and issubclass(kind, errors.ClusterxError)):
        kind = errors.ClusterxError
    raise kind(reply.error)


def read_line(sock: socket.socket) -> bytes:
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
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED: pid, uid, gid, set by the kernel
    when the connection was made)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
