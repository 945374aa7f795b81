"""The jobs table: a virtual list that draws only the rows on screen.

Textual's DataTable keeps a renderable per cell; filling it with 10,000 jobs takes seconds on the development VM
and updating a hundred cells a third of a second, far over a refresh tick. This widget keeps the rows in
`JobTableModel` and renders each visible line on demand (Textual's line API), so a tick costs the rows shown;
and of those only the lines whose text changed are drawn again (each line drawn is remembered as its cells).
Keys: up/down, page up/down, home/end move the cursor; Enter (or a double click) opens the job's run; a click
selects a row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from xtop.fmt import duration
from xtop.jobs import JobRow, JobTableModel, state_style


@dataclass(frozen=True)
class Column:
    title: str
    width: int  # 0: takes the width left over
    min_screen: int  # shown only when the table is at least this wide
    cell: Callable[[JobRow, datetime], str]
    right: bool = False


def _nodes_gpus(row: JobRow, _: datetime) -> str:
    return f"{row.nodes}x{row.gpus_per_node}g" if row.gpus_per_node else f"{row.nodes}x{row.procs_per_node}p"


COLUMNS: tuple[Column, ...] = (
    Column("ID", 6, 0, lambda r, _: str(r.id), right=True),
    Column("NAME", 0, 0, lambda r, _: r.name),
    Column("USER", 9, 0, lambda r, _: r.user),
    Column("STATE", 10, 0, lambda r, _: r.state),
    Column("BACKEND", 7, 0, lambda r, _: r.backend),
    Column("NODES", 6, 0, _nodes_gpus, right=True),
    Column("AGE", 7, 0, lambda r, now: duration(r.age_s(now)), right=True),
    Column("RUNTIME", 7, 0, lambda r, now: duration(r.run_time_s(now)), right=True),
    Column("TRY", 4, 0, lambda r, _: f"{r.attempt}/{r.max_retries + 1}", right=True),
    Column("HOSTS", 14, 120, lambda r, _: ",".join(r.hosts) or "-"),
    Column("RUN DIR", 0, 150, lambda r, _: r.run_dir or "-"),
)
NAME_MIN = 8
NAME_MAX = 40


class JobTable(ScrollView, can_focus=True):
    """Draws `model.order`; the cursor is an index into it and follows its job across re-sorts."""

    DEFAULT_CSS = """
    JobTable { height: 1fr; }
    JobTable > .jobtable--header { text-style: bold; background: $panel; }
    JobTable > .jobtable--cursor { background: $accent 40%; }
    """
    COMPONENT_CLASSES: ClassVar[set[str]] = {"jobtable--header", "jobtable--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "cursor(-1)", "Up", show=False),
        Binding("down,j", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
    ]
    cursor: reactive[int] = reactive(0)

    class Opened(Message):
        """Enter or a double click on a job."""

        def __init__(self, job: JobRow) -> None:
            super().__init__()
            self.job = job

    def __init__(self, model: JobTableModel, clock: Callable[[], datetime] | None = None, **kwargs: str) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.model = model
        self.clock = clock or (lambda: datetime.now(UTC))
        self._cursor_id: int | None = None
        self._now = self.clock()
        self._layouts: dict[int, list[tuple[Column, int]]] = {}
        self._drawn: dict[int, tuple[object, ...]] = {}  # line -> what render_line drew there last

    # -- data ---------------------------------------------------------------------------------------------------
    def rows_changed(self) -> None:
        """The model's order changed: keep the cursor on the same job, resize, redraw the visible lines."""
        order = self.model.order
        if self._cursor_id is not None:
            try:
                self.cursor = order.index(self._cursor_id)
            except ValueError:
                self.cursor = min(self.cursor, max(0, len(order) - 1))
        self.cursor = min(self.cursor, max(0, len(order) - 1))
        self._cursor_id = order[self.cursor] if order else None
        self._set_rows(len(order) + 1)
        self._now = self.clock()
        self._refresh_changed_lines()

    def _refresh_changed_lines(self) -> None:
        """Ask Textual to draw again only the lines whose content differs from what was drawn there."""
        width, top = self.size.width, int(self.scroll_offset.y)
        for y in range(1, self.size.height):
            if self._drawn.get(y) != self._line_content(top + y - 1, width):
                self.refresh(Region(0, y, width, 1))

    def _line_content(self, index: int, width: int) -> tuple[object, ...]:
        """What line `index` of the order shows: its cells and whether it is the cursor's (and focused)."""
        order = self.model.order
        if index >= len(order):
            return ()
        row = self.model.rows[order[index]]
        now = self._now
        cells = tuple(_fit(column.cell(row, now), w, column.right) for column, w in self._layout(width))
        return (index == self.cursor, self.has_focus, row.state, *cells)

    def _set_rows(self, rows: int) -> None:
        """Resize the scrollable area, only when it changed: a new virtual size lays the screen out again."""
        size = Size(self.size.width, rows)
        if size != self.virtual_size:
            self.virtual_size = size

    @property
    def selected(self) -> JobRow | None:
        if not self.model.order:
            return None
        return self.model.rows.get(self.model.order[min(self.cursor, len(self.model.order) - 1)])

    # -- cursor -------------------------------------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        order = self.model.order
        self._cursor_id = order[new] if 0 <= new < len(order) else None
        self._scroll_to_cursor()
        # The table may just have grown and its new size not be laid out yet (scrolling would stop at the old
        # end): look again once it is.
        self.call_after_refresh(self._scroll_to_cursor)
        self.refresh()

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.size.height - 1)
        top = int(self.scroll_offset.y)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def _move_to(self, index: int) -> None:
        count = len(self.model.order)
        self.cursor = max(0, min(index, count - 1)) if count else 0

    def action_cursor(self, delta: int) -> None:
        self._move_to(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor + direction * max(1, self.size.height - 2))

    def action_jump(self, where: int) -> None:
        self._move_to(0 if where == 0 else len(self.model.order) - 1)

    def key_enter(self) -> None:
        if (job := self.selected) is not None:
            self.post_message(self.Opened(job))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y < 1:
            return
        self._move_to(int(self.scroll_offset.y) + offset.y - 1)
        if event.chain >= 2 and (job := self.selected) is not None:
            self.post_message(self.Opened(job))

    # -- drawing ------------------------------------------------------------------------------------------------
    def _layout(self, width: int) -> list[tuple[Column, int]]:
        """Columns that fit; NAME (and RUN DIR, on wide screens) share what the fixed ones leave."""
        cached = self._layouts.get(width)
        if cached is None:
            cached = self._layouts[width] = self._compute_layout(width)
        return cached

    def _compute_layout(self, width: int) -> list[tuple[Column, int]]:
        shown = [c for c in COLUMNS if width >= c.min_screen]
        flexible = [c for c in shown if not c.width]
        left = max(NAME_MIN, width - sum(c.width for c in shown) - len(shown) + 1)
        name_width = left if len(flexible) == 1 else max(NAME_MIN, min(NAME_MAX, left // 2))
        widths = {c.title: c.width for c in shown if c.width}
        widths.update({c.title: name_width if c.title == "NAME" else max(1, left - name_width) for c in flexible})
        return [(c, widths[c.title]) for c in shown]

    def render_line(self, y: int) -> Strip:
        # Segments are built directly (no rich Text per line).
        width = self.size.width
        layout = self._layout(width)
        if y == 0:
            style = self.get_component_rich_style("jobtable--header")
            title = " ".join(_fit(c.title, w, c.right) for c, w in layout)
            return Strip([Segment(title, style)]).crop_extend(0, width, style)
        index = int(self.scroll_offset.y) + y - 1
        content = self._drawn[y] = self._line_content(index, width)
        if not content:
            return Strip.blank(width)
        is_cursor, focused, state_name, *cells = content
        if not is_cursor:
            base = Style()
        elif focused:
            base = self.get_component_rich_style("jobtable--cursor")
        else:
            base = _UNFOCUSED_CURSOR
        state = base + _state_rich_style(str(state_name))
        segments = []
        for position, ((column, _), cell) in enumerate(zip(layout, cells, strict=True)):
            if position:
                segments.append(Segment(" ", base))
            segments.append(Segment(str(cell), state if column.title == "STATE" else base))
        return Strip(segments).crop_extend(0, width, base)

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.model.order) + 1)


def _fit(text: str, width: int, right: bool = False) -> str:
    if len(text) > width:
        return text[: max(0, width - 1)] + "…"
    return text.rjust(width) if right else text.ljust(width)


_UNFOCUSED_CURSOR = Style(reverse=True, dim=True)


@functools.cache
def _state_rich_style(state: str) -> Style:
    return Style.parse(state_style(state) or "none")
