"""Small JSON file helpers shared by the writer and the readers: atomic rewrite (the workspace's one, from
clusterx.fileio, re-exported for deeptrace's writers), strict read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from clusterx.fileio import write_atomically

from deeptrace.errors import CutOffError, TraceInputError

__all__ = ["check_format_version", "dumps", "read_json_object", "write_atomically"]

# NaN and infinities become null (orjson's behaviour): JSON has no spelling for them.
_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def dumps(obj: Any, *, indent: bool = False) -> bytes:
    return orjson.dumps(obj, option=_DUMP_OPTIONS | (orjson.OPT_INDENT_2 if indent else 0))


def read_json_object(path: Path) -> dict[str, Any]:
    """Read a whole-file JSON object; anything else raises TraceInputError naming the file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TraceInputError(path, "file not found") from None
    except OSError as exc:
        raise TraceInputError(path, f"cannot read: {exc.strerror}") from None
    if not data.strip():
        raise TraceInputError(path, "file is empty (being written, or its writer died before writing it)")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # The document just stops: the rest of it was never written (or never copied).
        if exc.pos >= len(data.rstrip()) or str(exc).startswith("unexpected end of data"):
            raise CutOffError(
                path,
                f"invalid JSON: cut off after {len(data)} bytes (the file ends inside its JSON object: its writer"
                " died while writing it, or it was copied in part); not read",
            ) from None
        raise TraceInputError(path, f"invalid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceInputError(path, f"expected a JSON object, found {type(obj).__name__}")
    return obj


def check_format_version(path: Path, obj: dict[str, Any], supported: int) -> None:
    version = obj.get("format_version")
    if not isinstance(version, int):
        raise TraceInputError(path, "no integer 'format_version': not a deeptrace run-directory file")
    if version > supported:
        raise TraceInputError(
            path,
            f"format_version {version} is newer than this deeptrace understands ({supported}); "
            "upgrade deeptrace to read it",
        )
