"""The daemon's side of its socket (see clusterx.daemon.fastpath): a thread that accepts one request per connection
(a typed message of clusterx.daemon.messages) and answers it; a line that is no request gets an ErrorReply. The
caller is identified by the socket's peer credentials (SO_PEERCRED: set by the kernel, not by the caller), and every
request is checked by clusterx.ownership:

- `submit`, `retry`: root or the daemon's owner (it runs every job as itself);
- `cancel`, `priority`: the job's owner, root, or the daemon's owner.

The socket is mode 666, so that another user's `clusterx cancel` reaches the daemon and is told why it may not,
instead of a bare "permission denied"; the folder holding it (and the database) may restrict access further.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path

from clusterx.client import Client
from clusterx.daemon.fastpath import peer_uid, read_line
from clusterx.daemon.messages import (
    CancelReply,
    CancelRequest,
    ErrorReply,
    MessageError,
    PriorityRequest,
    RecordReply,
    Reply,
    Request,
    RetryRequest,
    SubmitRequest,
    decode_request,
    encode,
)
from clusterx.errors import ClusterxError, NotOwnerError
from clusterx.ownership import may_change, not_owner_message, runner_only_message, user_name
from clusterx.spec import JobSpec

log = logging.getLogger("clusterx.daemon")
# A caller gets this long to send its request: one that sends nothing must not hold the socket's only thread.
REQUEST_TIMEOUT_S = 10.0
SOURCE = "daemon-socket"


class SubmitServer(threading.Thread):
    def __init__(self, url: str, path: Path) -> None:
        super().__init__(name="clusterx-socket", daemon=True)
        self.url = url
        self.path = path
        self.uid = os.getuid()
        self.owner = user_name(self.uid)
        self._clients: dict[tuple[str, str | None], Client] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Bound and listening under a temporary name, then renamed over any previous daemon's socket: a client
        # that finds the path finds a socket that accepts (a connect between bind and listen would be refused).
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        staging.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(staging))
        os.chmod(staging, 0o666)  # noqa: PTH101 (every request is checked by its caller's uid, see module doc)
        self.sock.listen(64)
        staging.replace(self.path)

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(REQUEST_TIMEOUT_S)
                answer = self._answer_line(conn)
                # The caller may have gone away; what it asked for is in the database all the same.
                with contextlib.suppress(OSError):
                    conn.sendall(encode(answer))

    def _answer_line(self, conn: socket.socket) -> Reply:
        try:
            return self.answer(peer_uid(conn), decode_request(read_line(conn)))
        except MessageError as exc:  # not a request of clusterx.daemon.messages: the caller is told what is wrong
            return ErrorReply(f"bad request: {exc}")
        except OSError as exc:  # timed out or went away
            return ErrorReply(f"bad request: {exc}")
        except Exception as exc:  # an unexpected failure must not kill the socket thread
            log.exception("socket: request failed")
            return ErrorReply(f"the daemon failed: {exc}")

    def answer(self, uid: int, request: Request) -> Reply:
        """One request from the process of `uid`: its reply, or an ErrorReply naming the user error."""
        caller = user_name(uid)
        try:
            match request:
                case SubmitRequest():
                    return self._submit(uid, caller, request)
                case RetryRequest():
                    return self._retry(uid, caller, request)
                case CancelRequest():
                    return self._cancel(uid, caller, request)
                case PriorityRequest():
                    return self._priority(uid, caller, request)
        except ClusterxError as exc:
            if isinstance(exc, NotOwnerError):
                log.warning("refused %s from %s (uid %d): %s", request.OP, caller, uid, exc)
            return ErrorReply(str(exc), type(exc).__name__)

    # -- requests -------------------------------------------------------------------------------------------------
    def _submit(self, uid: int, caller: str, request: SubmitRequest) -> RecordReply:
        self._require_runner(uid, caller, "submit jobs")
        client = self._client(request.runs_dir)
        spec = JobSpec.from_mapping(request.spec, source=request.source)
        return RecordReply.of(client.submit(spec))

    def _retry(self, uid: int, caller: str, request: RetryRequest) -> RecordReply:
        self._require_runner(uid, caller, "retry jobs")
        return RecordReply.of(self._client(None).retry(request.job_id))

    def _cancel(self, uid: int, caller: str, request: CancelRequest) -> CancelReply:
        client = self._client(None)
        for job_id in request.job_ids:  # all checked before any is cancelled
            self._require_owner(uid, caller, job_id, "cancel")
        source = f"{SOURCE}:{caller}"
        states = {str(job_id): client.cancel_here([job_id], source=source)[job_id].value for job_id in request.job_ids}
        return CancelReply(states)

    def _priority(self, uid: int, caller: str, request: PriorityRequest) -> RecordReply:
        self._require_owner(uid, caller, request.job_id, "change")
        client = self._client(None)
        return RecordReply.of(client.set_priority_here(request.job_id, request.priority, f"{SOURCE}:{caller}"))

    # -- checks ---------------------------------------------------------------------------------------------------
    def _require_runner(self, uid: int, caller: str, action: str) -> None:
        if uid not in (0, self.uid):
            raise NotOwnerError(runner_only_message(action, caller, self.owner))

    def _require_owner(self, uid: int, caller: str, job_id: int, action: str) -> None:
        owner = self._client(None).store.get(job_id).user
        if not may_change(uid, owner, self.uid):
            raise NotOwnerError(not_owner_message(job_id, owner, action, caller, self.owner))

    def _client(self, runs_dir: str | None) -> Client:
        """Clients acting as the daemon's owner (the user its jobs run as), one per runs folder."""
        key = (self.owner, runs_dir)
        if key not in self._clients:
            self._clients[key] = Client(self.url, user=self.owner, runs_dir=runs_dir, via_daemon=False)
        return self._clients[key]
