"""What every main screen shares: a title bar naming the screens (clickable), and `update_view`."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import events
from textual.screen import Screen
from textual.visual import VisualType
from textual.widgets import Static

if TYPE_CHECKING:
    from xtop.app import XtopApp
    from xtop.state import XtopState

MODES = (("jobs", "1"), ("run", "2"), ("devices", "3"), ("trace", "4"))


class ModeBar(Static):
    """`xtop │ 1 jobs  2 run  3 devices  4 trace │ ? help`: the current screen highlighted; a click switches."""

    DEFAULT_CSS = "ModeBar { height: 1; background: $panel; }"

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def render(self) -> Text:
        text = Text(" xtop ", style="bold")
        for name, key in MODES:
            style = "bold reverse" if name == self.current else ""
            text.append(f" {key} {name} ", style=style)
        text.append("   ? help  q quit", style="dim")
        return text

    def on_click(self, event: events.Click) -> None:
        # Positions match render(): " xtop " is 6 cells, then each " K name " block.
        x, position = event.x, 6
        for name, _ in MODES:
            width = len(name) + 4
            if position <= x < position + width:
                self.app.switch_mode(name)
                return
            position += width


def show(widget: Static, content: Text, *, layout: bool = True) -> None:
    """Update a Static only when what it shows changed: an update lays the screen out again, which costs more
    than the rest of a tick on a large terminal. `layout=False` for a widget of fixed size (one line, say): its
    line is drawn again, and nothing is laid out."""
    shown = widget.content
    if isinstance(shown, Text) and shown.plain == content.plain and shown.spans == content.spans:
        return
    if layout:
        set_content(widget, content)
    else:
        widget.update(content, layout=False)


def set_content(widget: Static, content: VisualType) -> None:
    """`widget.update(content)`, and its height measured again at the next layout, whatever Textual has pending.

    Textual (8.2) caches a widget's size under a counter that `refresh(layout=True)` advances only when no layout
    of the widget is pending yet. Content that comes while one is pending, after a layout of the screen has
    already measured the old content under that counter, keeps the old height until the counter moves again,
    which on a run that stopped is never: the run screen's two-line stats stayed cut to one line (seen when the
    machine was busy enough that the widget's pending layout waited). Advancing the counter here closes that."""
    widget.update(content)
    if hasattr(widget, "_layout_updates"):
        widget._layout_updates += 1


class XtopScreen(Screen[None]):
    mode_name = ""

    @property
    def xtop(self) -> XtopApp:
        return cast("XtopApp", self.app)

    @property
    def state(self) -> XtopState:
        return self.xtop.state

    def update_view(self) -> None:
        """Redraw from `self.state`; called after each refresh while this screen shows, and when it comes back."""

    def on_screen_resume(self) -> None:
        self.update_view()
