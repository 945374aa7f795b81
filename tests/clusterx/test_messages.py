"""The daemon's socket messages are typed on both sides: each request and reply reads back as what was sent, a
line that is no request is a MessageError naming what is wrong, and the daemon answers it with a typed ErrorReply
and goes on serving."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from clusterx.daemon.api import SubmitServer
from clusterx.daemon.fastpath import read_line
from clusterx.daemon.messages import (
    CancelReply,
    CancelRequest,
    ErrorReply,
    MessageError,
    PriorityRequest,
    RecordReply,
    RetryRequest,
    SubmitRequest,
    decode_reply,
    decode_request,
    encode,
)
from clusterx.db.engine import resolve_db_url

REQUESTS = [
    SubmitRequest({"command": ["true"], "nodes": 2}, "spec.toml", "/runs"),
    RetryRequest(3),
    CancelRequest([1, 2]),
    PriorityRequest(4, -1),
]


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: r.OP)
def test_requests_read_back_as_sent(request_: SubmitRequest | RetryRequest | CancelRequest | PriorityRequest) -> None:
    assert decode_request(encode(request_)) == request_


def test_replies_read_back_as_sent() -> None:
    record = RecordReply({"id": 1, "record_version": 1}, "job 1 QUEUED on local: run dir /r")
    assert decode_reply(encode(record), RecordReply) == record
    assert decode_reply(encode(CancelReply({"1": "CANCELLED"})), CancelReply) == CancelReply({"1": "CANCELLED"})
    refusal = ErrorReply("job 9 belongs to bob", "NotOwnerError")
    assert decode_reply(encode(refusal), RecordReply) == refusal
    assert encode(refusal) == b'{"ok": false, "error": "job 9 belongs to bob", "kind": "NotOwnerError"}\n'


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"not json\n", "not JSON"),
        (b"[1]\n", "a JSON list, not an object"),
        (b'{"op": "reboot"}\n', "unknown request 'reboot'; requests are submit, retry, cancel, priority"),
        (b'{"job_id": 1}\n', "unknown request None"),
        (b'{"op": "retry"}\n', "request 'retry': missing key(s) ['job_id']"),
        (b'{"op": "retry", "job_id": 1, "force": true}\n', "request 'retry': unknown key(s) ['force']"),
        (b'{"op": "retry", "job_id": "1"}\n', "request 'retry': key 'job_id': '1' is not int"),
        (b'{"op": "retry", "job_id": true}\n', "key 'job_id': True is not int"),
        (b'{"op": "cancel", "job_ids": [1, "x"]}\n', "key 'job_ids': [1, 'x'] is not list[int]"),
        (b'{"op": "submit", "spec": [], "source": "x"}\n', "key 'spec': [] is not dict[str, Any]"),
    ],
)
def test_a_malformed_request_is_a_message_error(line: bytes, says: str) -> None:
    with pytest.raises(MessageError) as refused:
        decode_request(line)
    assert says in str(refused.value)


def test_a_reply_without_ok_is_a_message_error() -> None:
    with pytest.raises(MessageError, match="'ok'"):
        decode_reply(b'{"record": {}}\n', RecordReply)
    with pytest.raises(MessageError, match="missing key"):
        decode_reply(b'{"ok": true}\n', RecordReply)


def _ask(path: Path, line: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(line)
        return read_line(sock)


def test_the_daemon_answers_a_malformed_request_with_a_typed_error_and_goes_on(tmp_path: Path) -> None:
    server = SubmitServer(resolve_db_url(str(tmp_path / "jobs.db")), tmp_path / "daemon.sock")
    server.start()
    try:
        for line in (b"{not json\n", b'{"op": "cancel", "job_ids": "all"}\n', b'{"op": "reboot"}\n'):
            reply = decode_reply(_ask(server.path, line), CancelReply)
            assert isinstance(reply, ErrorReply) and reply.error.startswith("bad request: "), reply
        # Still serving, and a well-formed request's refusal names the error the caller raises again.
        reply = decode_reply(_ask(server.path, encode(CancelRequest([99]))), CancelReply)
        assert isinstance(reply, ErrorReply) and reply.kind == "JobNotFoundError" and "no job 99" in reply.error
    finally:
        server.close()
        server.join(timeout=10)
