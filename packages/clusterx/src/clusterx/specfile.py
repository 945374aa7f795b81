"""Reading a spec file (TOML) into a plain mapping; validation is JobSpec's job. Free of heavy imports, so
that the command line can read a spec file and hand it to the daemon without loading pydantic."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from clusterx.errors import SpecError


def read_spec_file(path: Path) -> dict[str, Any]:
    """The spec's keys: at the top level of the file, or in a single [job] table."""
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: spec file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}") from None
    if isinstance(data.get("job"), dict) and len(data) == 1:
        return dict(data["job"])
    return data
