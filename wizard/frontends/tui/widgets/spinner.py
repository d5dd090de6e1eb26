"""A one-line spinner with a message: shows that a thread is working and the UI is not frozen."""

from __future__ import annotations

from textual.widgets import Static

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Spinner(Static):
    """`start(text)` animates `⠋ text` ten times a second; `stop()` hides it."""

    DEFAULT_CSS = """
    Spinner { height: 1; color: $accent; display: none; }
    Spinner.-running { display: block; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self._frame = 0
        self._text = ""
        self._timer = None

    def start(self, text: str) -> None:
        self._text = text
        self.add_class("-running")
        self._render_frame()
        if self._timer is None:
            self._timer = self.set_interval(0.1, self._tick)

    def stop(self) -> None:
        self.remove_class("-running")
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    @property
    def running(self) -> bool:
        return self.has_class("-running")

    def _tick(self) -> None:
        self._frame = (self._frame + 1) % len(FRAMES)
        self._render_frame()

    def _render_frame(self) -> None:
        self.update(f"{FRAMES[self._frame]} {self._text}")
