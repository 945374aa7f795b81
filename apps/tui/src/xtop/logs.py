"""Following a job's log file: each poll reads only the bytes appended since the previous one."""

from __future__ import annotations

from pathlib import Path

MAX_READ = 4 << 20  # at most this much per poll, so a huge backlog fills the view over a few ticks


class LogTail:
    """New complete lines of a growing text file. A partial last line waits for its newline; a file that shrank
    (rotated, rewritten) is followed again from its start."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._offset = 0
        self._partial = b""

    def poll(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                size = handle.seek(0, 2)
                if size < self._offset:
                    self._offset, self._partial = 0, b""
                handle.seek(self._offset)
                data = handle.read(min(MAX_READ, size - self._offset))
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return []
        self._partial = data[end + 1 :]
        return data[:end].decode("utf-8", errors="replace").split("\n")
