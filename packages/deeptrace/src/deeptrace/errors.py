"""Errors deeptrace reports to users: each names the input it is about, never a traceback."""

from __future__ import annotations

from pathlib import Path


class TraceInputError(ValueError):
    """An input file that cannot be read as what it claims to be (truncated, invalid, of another tool)."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None) -> None:
        self.path = Path(path)
        self.problem = problem
        self.line = line
        where = f"{self.path}:{line}" if line is not None else str(self.path)
        super().__init__(f"{where}: {problem}")


class CutOffError(TraceInputError):
    """A file cut off mid-record: its writer died inside a record (a node that went down), or a copy stopped short.
    Where a reader can, it reads the records before the cut and names the cut with one of these."""
