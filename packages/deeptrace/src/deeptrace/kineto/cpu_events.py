"""The CPU side of a Kineto trace, kept compactly: what `deeptrace.kineto.cpu_timing` needs and nothing more.

Read in a second streaming pass, only for traces without GPU events (so GPU traces pay nothing for it). Kept
per complete ("X") CPU operator and user annotation: start, end, thread and a kind code (below); per CPU
collective (`gloo:*` annotations) and per operator of torch.distributed (`c10d::*`) also its name; per
`ProfilerStep#N` its window. Python function events
(`python_function`, recorded with `with_stack`) are not kept: they wrap whole call stacks, waits included, and
say nothing about whether the thread computes.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from deeptrace.analysis.table import _Interner
from deeptrace.kineto.steps import profiler_step
from deeptrace.kineto.stream import TraceEventStream

# Kind codes of the kept events.
OP = 0  # a CPU operator (aten::mm, autograd::engine::..., fsdp::all_gather_copy_in, ...)
COLLECTIVE_OP = 1  # an operator of the collective library on the issuing thread: issue or wait (c10d::allreduce_)
ANNOTATION = 2  # a user annotation (record_function): FSDP::all_gather (layers.0), ...
COLLECTIVE = 3  # a collective as the backend runs it, on its own thread: gloo:all_gather, gloo:all_reduce, ...

# Operators of torch.distributed's C++ library, as recorded on the thread that calls them.
COLLECTIVE_OP_NAME = re.compile(r"^(c10d::|_?c10d_functional::|record_param_comms$)")
# Collectives recorded by the backend's worker threads (gloo records each as a `gloo:<collective>` annotation).
COLLECTIVE_NAME = re.compile(r"^gloo:")
CPU_CATEGORIES = frozenset({"cpu_op", "user_annotation"})


@dataclass
class CpuEvents:
    """The kept CPU events of one trace, in columns; times in ns on the trace's own clock."""

    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    thread: npt.NDArray[np.int32]  # index into `threads`
    kind: npt.NDArray[np.int8]
    name_id: npt.NDArray[np.int32]  # index into `names` for COLLECTIVE and COLLECTIVE_OP events, -1 otherwise
    threads: list[tuple[Any, Any]]  # (pid, tid)
    thread_names: dict[tuple[Any, Any], str]
    names: list[str]
    steps: list[tuple[int, int, int]] = field(default_factory=list)
    op_time_ns: Counter[int] = field(default_factory=Counter)  # per thread index: total OP duration
    step_threads: Counter[int] = field(default_factory=Counter)  # per thread index: ProfilerStep annotations

    def __len__(self) -> int:
        return int(self.start_ns.size)


class _Collecting:
    def __init__(self) -> None:
        self.start, self.end = array("q"), array("q")
        self.thread, self.name = array("i"), array("i")
        self.kind = array("b")
        self.threads: dict[tuple[Any, Any], int] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.names = _Interner()
        self.steps: list[tuple[int, int, int]] = []
        self.op_time: Counter[int] = Counter()
        self.step_threads: Counter[int] = Counter()

    def add(self, event: dict[str, Any]) -> None:
        ph = event.get("ph")
        if ph == "M":
            if event.get("name") == "thread_name":
                self.thread_names[(event.get("pid"), event.get("tid"))] = str((event.get("args") or {}).get("name"))
            return
        cat = event.get("cat")
        if ph != "X" or cat not in CPU_CATEGORIES:
            return
        name = str(event.get("name", ""))
        start = round(event["ts"] * 1000)
        dur = round(event.get("dur", 0) * 1000)
        where = (event.get("pid"), event.get("tid"))
        thread = self.threads.setdefault(where, len(self.threads))
        if cat == "user_annotation" and name.startswith("ProfilerStep"):
            step = profiler_step(name, start, dur)
            if step is not None:  # the step windows are kept apart: they enclose everything, decide nothing
                self.steps.append(step)
                self.step_threads[thread] += 1
                return
        if COLLECTIVE_NAME.match(name):
            kind, name_id = COLLECTIVE, self.names(name)
        elif cat == "user_annotation":
            kind, name_id = ANNOTATION, -1
        elif COLLECTIVE_OP_NAME.match(name):
            kind, name_id = COLLECTIVE_OP, self.names(name)  # named: it says what the backend's collective is for
        else:
            kind, name_id = OP, -1
            self.op_time[thread] += dur
        self.start.append(start)
        self.end.append(start + dur)
        self.thread.append(thread)
        self.kind.append(kind)
        self.name.append(name_id)


def read_cpu_events(path: Path) -> CpuEvents:
    """One streaming pass over the trace keeping its CPU events (the trace was already validated as Kineto)."""
    kept = _Collecting()
    for event in TraceEventStream(path, allow_cut=True).events():  # a cut file: as the first pass read it
        if type(event) is dict:
            kept.add(event)
    return CpuEvents(
        start_ns=np.frombuffer(kept.start, np.int64),
        end_ns=np.frombuffer(kept.end, np.int64),
        thread=np.frombuffer(kept.thread, np.int32),
        kind=np.frombuffer(kept.kind, np.int8),
        name_id=np.frombuffer(kept.name, np.int32),
        threads=list(kept.threads),
        thread_names=kept.thread_names,
        names=kept.names.values,
        steps=kept.steps,
        op_time_ns=kept.op_time,
        step_threads=kept.step_threads,
    )
