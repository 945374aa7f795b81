"""The collector's C hot path: built and chosen by default, the same trace as the Python contexts, no leaked
references, calls checked like the Python methods, and a wheel that carries it (or, without it, still works).

The collector's behaviour tests (test_collect_trace.py, test_collect_nesting_tracks.py, test_heartbeat.py) run on
both hot paths; this file holds what only concerns the C one (the `native` fixture is in conftest.py).
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import subprocess
import sys
import threading
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deeptrace.collect import Collector, read_trace
from deeptrace.collect.native import HOT_PATH_ENV, native_chosen
from deeptrace.collect.trace_writer import SpanEncoder
from deeptrace.rundir import Heartbeat, layout, read_heartbeats
from deeptrace.spans import Category

from tests.conftest import REPO_ROOT

DEEPTRACE = REPO_ROOT / "packages/deeptrace"


def test_the_c_hot_path_is_built_and_chosen_by_default(native: Any, tmp_path: Path) -> None:
    assert native_chosen()
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        assert type(collector.span("x", Category.COMPUTE)) is native.SpanContext
        assert type(collector.collective("c")) is native.CollectiveContext


def _scripted_run(run_dir: Path) -> Heartbeat:
    """Every way of recording: nesting, explicit and counted sequence numbers, lanes, another thread, spans timed
    elsewhere, a buffer that fills within a step, default and given steps. Returns the heartbeat written from
    inside the last collective."""
    collector = Collector(run_dir, 1, 2, heartbeat_interval_s=None, buffer_spans=5)
    for step in range(3):
        collector.step_begin(step)
        with collector.span("forward", Category.COMPUTE, layer=step, nbytes=64):
            with collector.collective("all_gather", group="dp", nbytes=1024):
                pass
            with collector.collective("all_to_all", "ep", seq=10 + step, step=7):
                pass
            with collector.span("attention", Category.COMPUTE, step=100):
                pass
        begun = collector.collective("reduce_scatter", group="dp").begin()
        other = collector.span("prefetch", Category.MEMORY).begin()
        begun.end()
        other.end()
        collector.record("kernel", Category.COMPUTE, 10, 20, track="cuda:0/7")

        def load(index: int = step) -> None:
            with collector.span("load", Category.DATA, layer=index):
                pass

        worker = threading.Thread(target=load, name="loader")
        worker.start()
        worker.join()
        collector.step_end(step)
    with collector.span("save", Category.CHECKPOINT), collector.collective("barrier"):
        collector.write_heartbeat()
        inside = read_heartbeats(run_dir)[1]
    collector.close()
    return inside


def _timeless(run_dir: Path) -> list[tuple[object, ...]]:
    return [
        (s.name, s.category, s.track, s.step, s.layer, s.nbytes, s.group, s.seq)
        for s in read_trace(layout.trace_path(run_dir, 1))
    ]


def test_the_c_and_the_python_contexts_write_the_same_trace_and_heartbeat(
    native: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs, beats = {}, {}
    for hot_path in ("native", "python"):
        monkeypatch.setenv(HOT_PATH_ENV, hot_path)
        beats[hot_path] = _scripted_run(tmp_path / hot_path)
        runs[hot_path] = _timeless(tmp_path / hot_path)
    assert len(runs["python"]) == 3 * 9 + 2  # per step: 8 recorded and its window; the save and the barrier
    assert runs["native"] == runs["python"]
    for beat in beats.values():
        # dp: all_gather and reduce_scatter per step; ep: given seqs 10..12; world: the barrier, entered not left
        assert beat.groups == {"dp": (5, 5), "ep": (12, 12), "world": (0, None)}
        assert beat.in_collective is not None and (beat.in_collective.name, beat.in_collective.seq) == ("barrier", 0)
        assert beat.open_span is not None and beat.open_span.name == "barrier"
        assert beat.step_done == 2


def _record_and_close(run_dir: Path, name: str, category: Category, layer: int) -> weakref.ref[Collector]:
    collector = Collector(run_dir, 0, 1, heartbeat_interval_s=None, buffer_spans=64)
    for step in range(20):
        collector.step_begin(step)
        for _ in range(50):
            with collector.span(name, category, layer=layer), collector.collective(name, group=name, nbytes=layer):
                pass
            collector.span(name, category, nbytes=layer).begin().end()
        collector.step_end(step)
    collector.close()
    return weakref.ref(collector)


def _one_batch_of_every_kind(run_dir: Path) -> list[Any]:
    """The buffer of a C-path collector before its first flush: nested spans and collectives, lanes, another
    thread, a span timed elsewhere, a numpy step (not an int), a layer out of range (dropped)."""
    collector = Collector(run_dir, 0, 1, heartbeat_interval_s=None, buffer_spans=10_000, trace=False)
    collector.step_begin(4)
    with collector.span("forward", Category.COMPUTE, layer=3, nbytes=2**40):
        with collector.collective("all_gather", group="dp", nbytes=8), collector.span("deep", Category.MEMORY):
            pass
        lane = collector.collective("all_to_all", "ep", seq=2**62).begin()
    lane.end()
    with collector.span("numpy step", Category.DATA, step=np.int64(9)):
        pass
    with collector.span("layer too big", Category.COMPUTE, layer=2**31):
        pass
    collector.record("kernel", Category.COMPUTE, 5, 6, track="cuda:0/7", group="tp", seq=1)
    worker = threading.Thread(target=lambda: collector.span("load", Category.DATA).begin().end(), name="loader")
    worker.start()
    worker.join()
    batch = list(collector._buffer)
    collector.close()
    return batch


def test_the_c_packer_writes_the_bytes_of_the_python_encoder(native: Any, tmp_path: Path) -> None:
    """pack_records against SpanEncoder.encode_one, the reference: the same bytes for the same batch, with what
    it hands over to Python (the span timed elsewhere, the numpy step) and what both drop."""
    batch = _one_batch_of_every_kind(tmp_path)
    assert len(batch) == 8 and sum(type(item) is native.SpanContext for item in batch) == 5
    encoded = {}
    for packer in ("c", "python"):
        encoder = SpanEncoder(native if packer == "c" else None)
        with pytest.warns(UserWarning, match="a span was dropped, a field is invalid"):
            encoded[packer] = [encoder.encode(batch), encoder.encode(batch)]  # the second: every string known
    assert encoded["c"] == encoded["python"]
    assert len(encoded["c"][1]) == 7 * 58  # every span but the dropped one, and no more string records


def test_recording_leaks_no_reference_and_a_closed_collector_is_freed(native: Any, tmp_path: Path) -> None:
    # Objects of this test's own, so that their reference counts are this test's: 3,000 spans would move them by
    # thousands where a reference is leaked or dropped once per span.
    name, category, layer = "".join(["uniquely", "-named"]), Category.COMPUTE, int("12345")
    _record_and_close(tmp_path / "warm-up", name, category, layer)  # caches made once (interned ids, tracks)
    gc.collect()
    before = [sys.getrefcount(thing) for thing in (name, category, layer)]
    alive = _record_and_close(tmp_path / "run", name, category, layer)
    gc.collect()
    assert alive() is None, "the closed collector is still referenced (a reference cycle the GC cannot see)"
    assert [sys.getrefcount(thing) for thing in (name, category, layer)] == before


def test_calls_are_checked_like_the_python_methods(native: Any, tmp_path: Path) -> None:
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        span: Any = collector.span
        collective: Any = collector.collective
        with pytest.raises(TypeError, match="2 positional"):
            span("forward")
        with pytest.raises(TypeError, match="unexpected keyword argument 'lyer'"):
            span("forward", Category.COMPUTE, lyer=1)
        with pytest.raises(TypeError, match="unexpected keyword argument 'group'"):
            collective("all_gather", "dp", group="tp")
        with pytest.raises(ValueError, match="unknown span category 'fwd'"):
            span("forward", "fwd")
        with pytest.raises(RuntimeError, match="without being entered"):
            collector.span("forward", Category.COMPUTE).__exit__(None, None, None)
        with pytest.raises(RuntimeError, match="not started with begin"):
            collector.collective("all_gather").end()
        with pytest.raises(TypeError):
            collective("all_gather", seq="one").__enter__()


def test_a_with_block_binds_enter_and_exit_to_the_context_itself(native: Any, tmp_path: Path) -> None:
    """No bound method per `with`: __enter__ and __exit__ bind to the context, which enters when called with no
    argument and leaves with the three exception arguments; the unbound forms (contextlib.ExitStack's) still work."""
    with Collector(tmp_path, 0, 1, heartbeat_interval_s=None) as collector:
        span, collective = collector.span("forward", Category.COMPUTE), collector.collective("all_gather")
        for context in (span, collective):
            assert context.__enter__ is context and context.__exit__ is context
        with contextlib.ExitStack() as stack:
            assert stack.enter_context(span) is span
            assert stack.enter_context(collective) is collective
            assert span.start_ns and collective.start_ns and not collective.end_ns
        assert span.end_ns >= collective.end_ns > 0
        assert collective.parent is span  # entered inside it, through the unbound __enter__
        with pytest.raises(KeyError, match="raised inside"), collector.span("failing", Category.COMPUTE) as failing:
            raise KeyError("raised inside")  # __exit__ does not swallow it
        assert failing.end_ns > 0
        with pytest.raises(TypeError, match=r"SpanContext is entered and left by a `with` statement"):
            collector.span("forward", Category.COMPUTE)(1)
        with pytest.raises(TypeError, match=r"__enter__\(context\) of a span or collective context"):
            type(span).__enter__(object())
        with pytest.raises(TypeError, match=r"__exit__\(context, exc_type, exc, tb\)"):
            type(collective).__exit__(collective)
    names = [s.name for s in read_trace(layout.trace_path(tmp_path, 0))]
    assert sorted(names) == ["all_gather", "failing", "forward"]


def test_an_unknown_hot_path_choice_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(HOT_PATH_ENV, "fast")
    with pytest.raises(ValueError, match=r"DEEPTRACE_HOT_PATH='fast': use one of \['native', 'python'\]"):
        Collector(tmp_path, 0, 1, heartbeat_interval_s=None)


def _uv() -> list[str]:
    found = shutil.which("uv")
    if found is not None:
        return [found]
    return [sys.executable, "-m", "uv"]  # what the Makefile installs uv with when it is missing


@pytest.mark.parametrize("native_build", [True, False], ids=["with-compiler", "DEEPTRACE_NO_NATIVE"])
def test_the_wheel_carries_the_extension_or_falls_back_to_pure_python(native_build: bool, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DEEPTRACE_NO_NATIVE"}
    if not native_build:
        env["DEEPTRACE_NO_NATIVE"] = "1"
    elif shutil.which("cc") is None:
        pytest.skip("no C compiler")
    result = subprocess.run(
        [*_uv(), "build", "--wheel", "--out-dir", str(tmp_path), str(DEEPTRACE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("deeptrace-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    extensions = [name for name in names if name.startswith("deeptrace/collect/_hotpath") and name.endswith(".so")]
    if native_build:
        assert len(extensions) == 1 and "-cp311-" in wheel.name, (wheel.name, extensions)
    else:
        assert extensions == [] and wheel.name.endswith("-py3-none-any.whl"), wheel.name
        assert "pure-Python" in result.stderr
    assert "deeptrace/collect/contexts.py" in names and "deeptrace/collect/_hotpath.pyi" in names
