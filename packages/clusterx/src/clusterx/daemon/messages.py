"""The daemon's socket messages, typed on both sides: one JSON object per line each way, a request from the caller
(clusterx.daemon.fastpath) and its reply from the daemon (clusterx.daemon.api).

Dataclasses checked here, not pydantic: the quick `clusterx submit` through a running daemon costs an interpreter
start plus a round trip, and importing pydantic would cost several times that (a test keeps it out). Every message
is checked field by field as it is read, so a request with an unknown op, a missing or unknown key or a value of
the wrong type is a `MessageError`, which the daemon answers with an `ErrorReply` instead of failing.

On the wire a request is `{"op": ..., fields}` and a reply `{"ok": true, fields}` or `{"ok": false, "error",
"kind"}`: the shapes of before these types, so that a caller and a daemon of neighbouring versions still agree.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union

if TYPE_CHECKING:
    from clusterx.record import JobRecord


class MessageError(ValueError):
    """A line that is not a message of this module; the text says what is wrong with it."""


@dataclass(frozen=True)
class SubmitRequest:
    OP: ClassVar[str] = "submit"
    spec: dict[str, Any]  # a plain mapping of JobSpec's keys: the daemon validates it, with `source` in messages
    source: str = "spec"
    runs_dir: str | None = None


@dataclass(frozen=True)
class RetryRequest:
    OP: ClassVar[str] = "retry"
    job_id: int


@dataclass(frozen=True)
class CancelRequest:
    OP: ClassVar[str] = "cancel"
    job_ids: list[int]


@dataclass(frozen=True)
class PriorityRequest:
    OP: ClassVar[str] = "priority"
    job_id: int
    priority: int


Request = SubmitRequest | RetryRequest | CancelRequest | PriorityRequest
REQUESTS: dict[str, type[Request]] = {
    kind.OP: kind for kind in (SubmitRequest, RetryRequest, CancelRequest, PriorityRequest)
}


@dataclass(frozen=True)
class RecordReply:
    """A job's record after the request. `record` is a JobRecord's JSON, read as one by whoever needs it typed
    (`Client`, through clusterx.record.read_job_record, which also refuses a newer version); `summary` is its one
    line, so that the quick submit prints it without loading pydantic."""

    record: dict[str, Any]
    summary: str

    @classmethod
    def of(cls, record: JobRecord) -> RecordReply:
        return cls(record.to_dict(), record.summary())


@dataclass(frozen=True)
class CancelReply:
    states: dict[str, str]  # job id (a string, as JSON keys are) → its state after the cancel


@dataclass(frozen=True)
class ErrorReply:
    """A refusal: `kind` names the clusterx.errors class the caller raises again, with `error` as its message."""

    error: str
    kind: str = "ClusterxError"


Reply = RecordReply | CancelReply | ErrorReply
R = TypeVar("R", RecordReply, CancelReply)


def encode(message: Request | Reply) -> bytes:
    fields = dataclasses.asdict(message)
    if isinstance(message, RecordReply | CancelReply | ErrorReply):
        head: dict[str, Any] = {"ok": not isinstance(message, ErrorReply)}
    else:
        head = {"op": message.OP}
    return json.dumps({**head, **fields}).encode() + b"\n"


def decode_request(line: bytes) -> Request:
    obj = _object(line)
    op = obj.pop("op", None)
    kind = REQUESTS.get(op) if isinstance(op, str) else None
    if kind is None:
        raise MessageError(f"unknown request {op!r}; requests are {', '.join(REQUESTS)}")
    return _build(kind, obj)


def decode_reply(line: bytes, expected: type[R]) -> R | ErrorReply:
    """The reply to a request whose success is answered by `expected`."""
    obj = _object(line)
    ok = obj.pop("ok", None)
    if not isinstance(ok, bool):
        raise MessageError("a reply without a true or false 'ok'")
    return _build(expected, obj) if ok else _build(ErrorReply, obj)


def _object(line: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError as error:  # UnicodeDecodeError is one too
        raise MessageError(f"not JSON ({error})") from None
    if not isinstance(obj, dict):
        raise MessageError(f"a JSON {type(obj).__name__}, not an object")
    return obj


M = TypeVar("M")


def _build(kind: type[M], obj: dict[str, Any]) -> M:
    hints = _field_types(kind)
    unknown = sorted(set(obj) - set(hints))
    if unknown:
        raise MessageError(f"{_name(kind)}: unknown key(s) {unknown}; keys are {sorted(hints)}")
    required = {f.name for f in dataclasses.fields(kind) if f.default is dataclasses.MISSING}  # type: ignore[arg-type]
    missing = sorted(required - set(obj))
    if missing:
        raise MessageError(f"{_name(kind)}: missing key(s) {missing}")
    for key, value in obj.items():
        if not _fits(value, hints[key]):
            raise MessageError(f"{_name(kind)}: key {key!r}: {value!r} is not {_spell(hints[key])}")
    return kind(**obj)


def _field_types(kind: type[Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(kind)
    return {f.name: hints[f.name] for f in dataclasses.fields(kind)}


def _fits(value: object, hint: Any) -> bool:
    """Whether a JSON value is of the type a field declares (the types these messages use, no more)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return any(_fits(value, arg) for arg in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(item, args[0]) for item in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(item, args[1]) for item in value.values())
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)  # JSON's true is no job id
    return hint is Any or (value is None if hint is type(None) else isinstance(value, hint))


def _spell(hint: Any) -> str:
    """int, list[int], str | None: as the field's annotation reads."""
    plain = typing.get_origin(hint) is None and isinstance(hint, type)
    return hint.__name__ if plain else str(hint).replace("typing.", "")


def _name(kind: type[Any]) -> str:
    op = getattr(kind, "OP", None)
    return f"request {op!r}" if op else f"reply {kind.__name__}"
