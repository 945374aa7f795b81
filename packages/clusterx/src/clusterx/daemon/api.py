"""The daemon's side of the submit socket (see clusterx.daemon.fastpath): a thread that accepts one JSON
request per connection and answers with the stored job's record, using the same `Client.submit` as everyone."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import socket
import threading
from pathlib import Path
from typing import Any

from clusterx.client import Client
from clusterx.daemon.fastpath import peer_uid, read_line
from clusterx.errors import ClusterxError
from clusterx.spec import JobSpec

log = logging.getLogger("clusterx.daemon")


class SubmitServer(threading.Thread):
    def __init__(self, url: str, path: Path) -> None:
        super().__init__(name="clusterx-submit-socket", daemon=True)
        self.url = url
        self.path = path
        self._clients: dict[tuple[str, str | None], Client] = {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Bound and listening under a temporary name, then renamed over any previous daemon's socket: a client
        # that finds the path finds a socket that accepts (a connect between bind and listen would be refused).
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        staging.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(staging))
        os.chmod(staging, 0o600)  # noqa: PTH101 (a socket path; Path.chmod works too, this reads plainer)
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
                try:
                    answer = self._answer(conn)
                except Exception as exc:  # an unexpected failure must not kill the socket thread
                    log.exception("submit socket: request failed")
                    answer = {"ok": False, "error": f"the daemon failed to submit: {exc}"}
                # The submitter may have gone away; the job (if stored) is in the database all the same.
                with contextlib.suppress(OSError):
                    conn.sendall(json.dumps(answer).encode() + b"\n")

    def _answer(self, conn: socket.socket) -> dict[str, Any]:
        uid = peer_uid(conn)
        if uid != os.getuid():
            return {"ok": False, "error": "this daemon runs jobs only for its own user"}
        request = json.loads(read_line(conn))
        if request.get("op") != "submit":
            return {"ok": False, "error": f"unknown request {request.get('op')!r}"}
        user = pwd.getpwuid(uid).pw_name
        client = self._client(user, request.get("runs_dir"))
        try:
            spec = JobSpec.from_mapping(request["spec"], source=request.get("source", "spec"))
            return {"ok": True, "record": client.submit(spec)}
        except ClusterxError as exc:
            return {"ok": False, "error": str(exc)}

    def _client(self, user: str, runs_dir: str | None) -> Client:
        key = (user, runs_dir)
        if key not in self._clients:
            self._clients[key] = Client(self.url, user=user, runs_dir=runs_dir)
        return self._clients[key]
