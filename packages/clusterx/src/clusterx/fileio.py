"""One way to replace a file atomically, for every package of the workspace (stdlib only: the daemon's wrapper,
deeptrace's collector and xtrain's data cache import it without loading anything heavy)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: Path, data: bytes | str, *, fsync: bool = True, fsync_folder: bool = False) -> None:
    """Replace `path` with `data` (str is written as UTF-8): a reader sees the old file or the new one, never a mix.

    The temporary file sits in the same folder (os.replace is atomic only within one file system) and is named by
    pid and thread, so concurrent writers never share one. `fsync` makes the content durable before the rename (a
    crash cannot leave a renamed but empty file); `fsync_folder` also makes the rename itself durable, for a file
    whose presence means something (a checkpoint's completion marker). A file rewritten many times a second whose
    loss on a power cut does not matter (a heartbeat) passes fsync=False.
    """
    payload = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with tmp.open("wb") as out:
            out.write(payload)
            if fsync:
                out.flush()
                os.fsync(out.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync_folder:
        descriptor = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
