"""Writes batches of span records to trace/rank-{R}.dtr from a background thread.

The collector hands over a batch (the strings first defined in it and its span tuples) at step end; this thread
packs and appends it. Training code spends most of its time in calls that release the GIL (GPU waits, collectives,
BLAS), so the packing usually costs the training thread nothing. Batches are written in the order handed over,
which keeps every string definition ahead of the spans that use it.
"""

from __future__ import annotations

import queue
import struct
import threading
import warnings
from pathlib import Path

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.contexts import Record

Batch = tuple[list[tuple[int, str]], list[Record]]


class TraceFileWriter:
    def __init__(self, path: Path, rank: int, world_size: int) -> None:
        self.path = path
        self._file = path.open("wb", buffering=0)
        self._file.write(fmt.HEADER.pack(fmt.MAGIC, fmt.TRACE_FORMAT_VERSION, fmt.HEADER.size, rank, world_size))
        self._queue: queue.SimpleQueue[Batch | threading.Event | None] = queue.SimpleQueue()
        self._failed = False
        self._thread = threading.Thread(target=self._run, name=f"deeptrace-trace-{rank}", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        self._queue.put(batch)

    def wait(self) -> None:
        """Return once every batch submitted so far is on disk."""
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._file.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            strings, records = item
            try:
                self._file.write(_pack_strings(strings) + _pack_spans(records))
            except OSError as exc:
                # Tracing must never take the training job down: say it once, drop the data.
                if not self._failed:
                    self._failed = True
                    warnings.warn(f"deeptrace: cannot write {self.path} ({exc}); spans are dropped", stacklevel=1)


def _pack_strings(strings: list[tuple[int, str]]) -> bytes:
    parts = []
    for string_id, text in strings:
        encoded = text.encode()[: fmt.MAX_STRING_BYTES]
        parts.append(fmt.STRING_HEAD.pack(fmt.TAG_STRING, string_id, len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def _pack_spans(records: list[Record]) -> bytes:
    pack = fmt.SPAN.pack
    try:
        return b"".join([pack(*record) for record in records])
    except (struct.error, TypeError):
        # A field out of range or of the wrong type: keep every valid span, warn about the bad ones.
        kept = []
        for record in records:
            try:
                kept.append(pack(*record))
            except (struct.error, TypeError) as error:
                warnings.warn(f"deeptrace: span dropped, a field is invalid ({error}): {record}", stacklevel=1)
        return b"".join(kept)
