"""Writes batches of spans to trace/rank-{R}.dtr from a background thread.

The collector hands over its buffer (finished span contexts and raw spans) at step end; this thread gives names,
tracks and groups their string ids, packs the records and appends them, string definitions first. Training code
spends most of its time in calls that release the GIL (GPU waits, collectives, BLAS), so this work usually
costs the training thread nothing. Batches are written in the order handed over, and handed back to be freed
by the thread that recorded them (`release_written`).
"""

from __future__ import annotations

import queue
import struct
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias, cast

from deeptrace.collect import trace_format as fmt
from deeptrace.collect.contexts import CollectiveContext, RawSpan, SpanContext, track_key, track_name
from deeptrace.collect.native import native_module

if TYPE_CHECKING:
    from deeptrace.collect.contexts import TimedContext

    BufferItem: TypeAlias = TimedContext | RawSpan

# The C hot path's context classes where it is built (else the Python ones again, so the checks below stay true).
_native = native_module()
NATIVE_SPAN: type = SpanContext if _native is None else _native.SpanContext
NATIVE_COLLECTIVE: type = CollectiveContext if _native is None else _native.CollectiveContext


class SpanEncoder:
    """Turns buffered spans into file bytes; owns the file's string table (used by one thread only)."""

    def __init__(self, native: ModuleType | None = None) -> None:
        self._native = native  # the C module packs its own contexts (pack_records); None: all in Python
        self._codes = fmt.CATEGORY_CODES
        self._ids: dict[str, int] = {}
        self._new: list[tuple[int, str]] = []
        self._track_ids: dict[tuple[str, int], int] = {}  # per (thread, depth or -1 - lane)

    def _intern(self, text: str) -> int:
        string_id = self._ids.get(text)
        if string_id is None:
            string_id = self._ids[text] = len(self._ids)
            self._new.append((string_id, text))
        return string_id

    def _track_id(self, context: TimedContext) -> int:
        """String id of the track of a context the collector timed (cached per thread and depth or lane)."""
        key = track_key(context)
        track_id = self._track_ids.get(key)
        if track_id is None:
            track_id = self._track_ids[key] = self._intern(track_name(key))
        return track_id

    def encode(self, items: list[BufferItem]) -> bytes:
        """A batch's bytes: the strings it defines first, then its span records in order."""
        if self._native is not None:
            records: bytes = self._native.pack_records(items, self)  # C contexts in C, the rest by encode_one
        else:
            encode_one = self.encode_one
            records = b"".join([encode_one(item) for item in items])
        strings, self._new = self._new, []
        return _pack_strings(strings) + records

    def encode_one(self, item: BufferItem) -> bytes:
        """One span's record (b"" for one with an invalid field, dropped with a warning). The reference that the C
        packer (_hotpath.pack_records) matches, and what it hands everything else to."""
        try:
            kind = type(item)
            if kind is SpanContext or kind is NATIVE_SPAN:
                item = cast(SpanContext, item)
                name, category, start, end = item.name, item.category, item.start_ns, item.end_ns
                step, layer, nbytes, group_id, seq = item.step, item.layer, item.nbytes, fmt.NO_STRING, None
                track_id = self._track_id(item)
            elif kind is CollectiveContext or kind is NATIVE_COLLECTIVE:
                item = cast(CollectiveContext, item)
                name, category, start, end = item.name, item.category, item.start_ns, item.end_ns
                step, layer, nbytes, seq = item.step, None, item.nbytes, item.seq
                group_id = self._intern(item.group)
                track_id = self._track_id(item)
            else:
                raw = cast(RawSpan, item)  # what remains: spans timed elsewhere (record, step windows)
                name, category, start, end, track, step, layer, nbytes, group, seq = raw
                track_id = self._intern(track)
                group_id = fmt.NO_STRING if group is None else self._intern(group)
            none32, none64 = fmt.NONE_I32, fmt.NONE_I64
            return fmt.SPAN.pack(
                fmt.TAG_SPAN,
                self._codes[category],
                self._intern(name),
                track_id,
                group_id,
                start,
                end,
                none64 if step is None else step,
                none32 if layer is None else layer,
                none64 if seq is None else seq,
                none64 if nbytes is None else nbytes,
            )
        except (struct.error, TypeError, KeyError, AttributeError) as error:
            # A field out of range or of the wrong type: drop this span, keep the others.
            warnings.warn(f"deeptrace: a span was dropped, a field is invalid ({error})", stacklevel=1)
            return b""


class TraceFileWriter:
    def __init__(self, path: Path, rank: int, world_size: int, native: ModuleType | None = None) -> None:
        self.path = path
        self._file = path.open("wb", buffering=0)
        self._file.write(fmt.HEADER.pack(fmt.MAGIC, fmt.TRACE_FORMAT_VERSION, fmt.HEADER.size, rank, world_size))
        self._encoder = SpanEncoder(native)
        self._queue: queue.SimpleQueue[list[BufferItem] | threading.Event | None] = queue.SimpleQueue()
        self._failed = False
        # Batches packed and written, kept for the recording thread to free (release_written): freeing a span
        # writes to everything it refers to (its name, category and step objects, the collector's objects) and to
        # the allocator's lists that the next spans are taken from. Done here, on another core, every one of those
        # cache lines would move over to this thread and back to the training thread at its next spans.
        self._written: list[list[BufferItem]] = []
        self._thread = threading.Thread(target=self._run, name=f"deeptrace-trace-{rank}", daemon=True)
        self._thread.start()

    def submit(self, batch: list[BufferItem]) -> None:
        self._queue.put(batch)

    def release_written(self) -> None:
        """Free the batches written so far, on the calling thread (the one that recorded them)."""
        self._written = []  # a batch appended meanwhile to the old list is freed with it, or by this thread

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
            data = self._encoder.encode(item)
            self._written.append(item)
            del item
            try:
                self._file.write(data)
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
