"""The binary layout of trace/rank-{R}.dtr, shared by the writer and the reader.

A file is a header followed by records, appended in order and never rewritten:

    header   magic b"DEEPTRC\\0", format version u16, header size u16, rank u32, world size u32   (20 bytes)
    string   tag=1 u8, id u32, length u16, then `length` bytes of UTF-8                        (7 + length bytes)
    span     tag=2 u8, category u8, name id u32, track id u32, group id u32, start ns i64, end ns i64,
             step i64, layer i32, seq i64, nbytes i64                                          (58 bytes)

Little-endian throughout. A string record defines an id before the first span that uses it (the append-only
string table); a missing optional value is stored as the smallest value of its type (`NONE_I32`, `NONE_I64`,
`NO_STRING` for the group). A process killed while writing leaves at most one partial record at the end, which
the reader ignores. docs/run-directory.md is the reference.
"""

from __future__ import annotations

import struct

from deeptrace.spans import Category

MAGIC = b"DEEPTRC\x00"
TRACE_FORMAT_VERSION = 1

HEADER = struct.Struct("<8sHHII")
STRING_HEAD = struct.Struct("<BIH")
SPAN = struct.Struct("<BBIIIqqqiqq")

TAG_STRING = 1
TAG_SPAN = 2

NONE_I32 = -(2**31)
NONE_I64 = -(2**63)
NO_STRING = 0xFFFFFFFF
MAX_STRING_BYTES = 0xFFFF

# Fixed codes, never reordered: files written today must read the same tomorrow.
CATEGORY_CODES: dict[Category, int] = {
    Category.COMPUTE: 0,
    Category.COMM: 1,
    Category.MEMORY: 2,
    Category.SYNC: 3,
    Category.DATA: 4,
    Category.OPTIMIZER: 5,
    Category.CHECKPOINT: 6,
    Category.OTHER: 7,
}
CATEGORY_OF_CODE: dict[int, Category] = {code: category for category, code in CATEGORY_CODES.items()}

# The collector marks each step from step_begin to step_end with a span of this name on this track, so analyses
# know the step windows (and so the idle time inside a step). It is the only span on its track.
STEP_SPAN_NAME = "step"
STEP_TRACK = "steps"
