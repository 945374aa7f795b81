"""Every screen at 80x24 and at 200x60, compared with the accepted pictures (pytest-textual-snapshot; update with
`pytest tests/tui/test_snapshots.py --snapshot-update` after checking the new pictures by eye)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from textual.pilot import Pilot
from xtop.app import XtopApp

from tests.tui.builders import FIXED_NOW, fixed_resources
from tests.tui.snapshot_world import NOW_S, build_world

# One world at fixed paths: these tests must not run beside each other.
pytestmark = pytest.mark.xdist_group("xtop-snapshots")

SIZES = {"80x24": (80, 24), "200x60": (200, 60)}


def _app(mode: str) -> XtopApp:
    db, run_dir = build_world()
    return XtopApp(db=db, run_dirs=[run_dir], refresh_s=3600, stale_after_s=60, clock=lambda: FIXED_NOW,
                   wall_clock=lambda: NOW_S, sampler=fixed_resources, start_mode=mode)  # fmt: skip


async def _settled(pilot: Pilot[None]) -> None:
    app = pilot.app
    assert isinstance(app, XtopApp)
    for _ in range(400):
        if app.ticks >= 1 and app.state.jobs.loaded:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.1)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("mode", ["jobs", "run", "devices", "trace"])
def test_screen(mode: str, size: str, snap_compare: Callable[..., bool]) -> None:
    assert snap_compare(_app(mode), terminal_size=SIZES[size], run_before=_settled)


def test_help(snap_compare: Callable[..., bool]) -> None:
    assert snap_compare(_app("jobs"), press=["question_mark"], terminal_size=(80, 24), run_before=_settled)
