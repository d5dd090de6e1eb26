"""The Textual side of the live view: the App, its widgets and the entry points make_view_app / run_view
(the model is in launch/follow.py, which never imports this module).

Everything drawn comes from launch.follow.ViewState, which comes only from the run directory. The
line renderers (`gpu_line`, `header_lines`, `spark`, `bar`) are plain functions from data to
rich Text, so widths and N/A handling can be tested without an app.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rich.style import Style
from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Size
from textual.screen import ModalScreen
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Button, Footer, Input, Label, Static

from launch.rundir import (
    ACTIVE_STATUSES,
    attempts_allowed,
    mark_lost_if_dead,
    read_state,
    state_problem,
    supervisor_alive,
)
from launch.follow import (
    ACTIVE,
    DEFAULT_GRACE_S,
    DETACHED,
    FINISHED,
    LAUNCHER,
    LOG_PANE_LINES,
    QUIT,
    STOPPED,
    WIZARD,
    LogLine,
    RunFollower,
    ViewState,
    _as_int,
    as_number,
    elapsed_s,
    send_control,
    status_text,
)
from wizard.units import GiB, fmt_clock

SPARK = "▁▂▃▄▅▆▇█"
PARTIAL = " ▏▎▍▌▋▊▉"


# ---------------------------------------------------------------- colours (theme-aware)

class Palette:
    """Colours resolved from the current Textual theme, so light and dark themes both read well."""

    # rank tags: mid-luminance hues, one set tuned for dark backgrounds, one for light
    DARK_RANKS = ["#5FAFFF", "#FFAF5F", "#87D787", "#FF8787", "#D7AFFF", "#D7D75F", "#5FD7D7", "#FF87D7"]
    LIGHT_RANKS = ["#005FAF", "#AF5F00", "#008700", "#AF0000", "#8700AF", "#5F5F00", "#008787", "#AF005F"]

    def __init__(self, app: App | None) -> None:
        v: dict[str, str] = {}
        dark = True
        if app is not None:
            try:
                v = app.theme_variables or app.get_css_variables()
                dark = app.current_theme.dark
            except AttributeError:         # a Textual without theme_variables / current_theme: the dark defaults
                v = {}
        def pick(name: str, fallback: str) -> Style:
            value = v.get(name, fallback)
            return Style(color=value if value.startswith("#") else fallback)
        self.ok = pick("text-success", "#8AD4A1")
        self.warn = pick("text-warning", "#FFC473")
        self.err = pick("text-error", "#D17E92")
        self.accent = pick("text-primary", "#57A5E2")
        self.muted = Style(dim=True)
        self.bold = Style(bold=True)
        self.ranks = self.DARK_RANKS if dark else self.LIGHT_RANKS
        self.match = Style(color="#000000", bgcolor="#FFD75F")
        self.current_match = Style(color="#000000", bgcolor="#FF8700", bold=True)

    def rank(self, rank: int) -> Style:
        if rank == LAUNCHER:
            return self.muted + Style(bold=True)
        if rank == WIZARD:
            return self.warn + Style(bold=True)
        return Style(color=self.ranks[rank % len(self.ranks)], bold=True)

    def status(self, status: str) -> Style:
        return {"running": self.ok, "succeeded": self.ok, "failed": self.err, "lost": self.err,
                "starting": self.warn, "restarting": self.warn, "stopping": self.warn,
                }.get(status, self.muted) + self.bold


# ---------------------------------------------------------------- pure renderers

def bar(fraction: float | None, width: int, style: Style, empty: Style) -> Text:
    """A horizontal bar with eighth-block precision; None draws a dotted N/A track."""
    if width <= 0:
        return Text()
    if fraction is None:
        return Text("·" * width, style=empty)
    f = min(1.0, max(0.0, fraction))
    eighths = int(round(f * width * 8))
    full, part = divmod(eighths, 8)
    filled = "█" * full + (PARTIAL[part] if part and full < width else "")
    return Text.assemble((filled, style), ("░" * (width - len(filled)), empty))


def spark(values: list[float | None], width: int, lo: float | None = None,
          hi: float | None = None) -> str:
    """A one-line sparkline of `values` squeezed into `width` cells (max per bucket)."""
    if width <= 0 or not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        buckets = []
        for i in range(width):
            chunk = [v for v in values[int(i * step):int((i + 1) * step)] if v is not None]
            buckets.append(max(chunk) if chunk else None)
        values = buckets
    nums = [v for v in values if v is not None]
    if not nums:
        return " " * len(values)
    lo = min(nums) if lo is None else lo
    hi = max(nums) if hi is None else hi
    span = (hi - lo) or 1.0
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARK[min(7, max(0, int((v - lo) / span * 7 + 0.5)))])
    return "".join(out)


def _gib(n: float | None) -> str:
    return "N/A" if n is None else f"{n / GiB:.1f}"


def includes_reserve(g: dict[str, Any]) -> bool:
    """Whether the sample's memory used counts the driver's reserve (NVML v1), unlike nvidia-smi's."""
    return g.get("mem_used") is not None and g.get("mem_reserved") is None


def gpu_line(g: dict[str, Any], history: list[float | None], width: int, pal: Palette) -> Text:
    """One GPU in one terminal line: index, util bar, memory bar, power, temperature, sparkline."""
    util = as_number(g.get("util"))
    used, total = as_number(g.get("mem_used")), as_number(g.get("mem_total"))
    power, limit = as_number(g.get("power_w")), as_number(g.get("power_limit_w"))
    temp = as_number(g.get("temp_c"))
    mem_frac = used / total if used is not None and total else None

    util_txt = "N/A " if util is None else f"{util:>3.0f}%"
    if used is None and total is None:
        mem_txt = "N/A"
    else:
        # "*" in place of "G": NVML's v1 figure, which counts the driver's reserve that nvidia-smi's "used" leaves out
        # (mem_reserved is None: an older driver, or a metrics.jsonl written before the sampler read v2); the title
        # says so.
        mem_txt = f"{_gib(used)}/{_gib(total)}" + ("*" if includes_reserve(g) else "G")
    pw_txt = "N/A" if power is None else f"{power:.0f}"
    pw_txt += "/" + ("N/A" if limit is None else f"{limit:.0f}") + "W"
    temp_txt = "N/A" if temp is None else f"{temp:.0f}°C"

    fixed = 4 + 1 + 1 + 4 + 1 + 1 + 12 + 1 + 9 + 1 + 5   # label, gaps and the numbers
    bars = max(4, min(16, (width - fixed - 10) // 3))
    spark_w = max(0, min(60, width - fixed - 2 * bars - 1))
    if spark_w < 6:
        spark_w = 0
        bars = max(3, min(16, (width - fixed) // 2))

    mem_style = pal.accent if mem_frac is None or mem_frac < 0.85 else (
        pal.warn if mem_frac < 0.95 else pal.err)
    t = Text(no_wrap=True, overflow="crop")
    t.append(f"{g.get('index', '?'):>3} ", pal.bold)
    t.append_text(bar(None if util is None else util / 100, bars, pal.ok, pal.muted))
    t.append(f" {util_txt} ")
    t.append_text(bar(mem_frac, bars, mem_style, pal.muted))
    t.append(f" {mem_txt:>12}")
    t.append(f" {pw_txt:>9}", pal.muted if power is None else Style())
    t.append(f" {temp_txt:>5}", pal.warn if temp is not None and temp >= 85 else Style())
    if spark_w:
        t.append(" ")
        t.append(spark(history, spark_w, 0, 100).rjust(spark_w), pal.ok)
    return t


def header_lines(state: ViewState, now: float, width: int, message: str | None,
                 pal: Palette) -> Text:
    run = state.run
    status = state.status
    attempt = run.get("attempt")
    restarts = run.get("max_restarts")
    attempts = f"{attempt}/{attempts_allowed(run)}" if attempt is not None and isinstance(restarts, int) else str(attempt or "?")
    line1 = Text(no_wrap=True, overflow="ellipsis")
    line1.append("● " + status.upper(), pal.status(status))
    line1.append(f"  attempt {attempts}  elapsed {fmt_clock(elapsed_s(run, now))}")
    if message:                      # before the less important bits, which get cut first
        line1.append("  ")
        line1.append(message, pal.warn + pal.bold)
    if run.get("world_size"):
        line1.append(f"  {run['world_size']} ranks", pal.muted)
    if run.get("id"):
        line1.append(f"  {run['id']}", pal.muted)

    p = run.get("progress") or {}
    step, total = as_number(p.get("step")), as_number(p.get("total"))
    tail = Text(no_wrap=True)
    if as_number(p.get("eta_s")) is not None and status not in FINISHED:
        tail.append(f"  ETA {fmt_clock(p['eta_s'])}")
    if as_number(p.get("rate")) is not None:
        tail.append(f"  {p['rate']:.2f} it/s")
    if as_number(p.get("loss")) is not None:
        tail.append("  loss ")
        tail.append(f"{p['loss']:.4g}", pal.bold)
    if as_number(p.get("learning_rate")) is not None:
        tail.append(f"  lr {p['learning_rate']:.1e}", pal.muted)
    line2 = Text(no_wrap=True, overflow="ellipsis")
    if step is not None:
        head = f"step {step:.0f}/{total:.0f} " if total else f"step {step:.0f} "
        pct = f" {100 * step / total:3.0f}%" if total else ""
        bar_w = max(5, min(40, width - len(head) - len(pct) - tail.cell_len))
        line2.append(head)
        line2.append_text(bar(step / total if total else None, bar_w, pal.accent, pal.muted))
        line2.append(pct)
    else:
        line2.append("waiting for the first training step", pal.muted)
    line2.append_text(tail)
    for line in (line1, line2):
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join([line1, line2])


def train_line(state: ViewState, width: int, pal: Palette) -> Text:
    half = max(20, width // 2)
    t = Text(no_wrap=True, overflow="crop")
    loss = list(state.loss)
    label = f"loss {loss[-1]:.4g} " if loss else "loss N/A "
    t.append(label, pal.bold)
    t.append(spark(loss, max(0, half - len(label) - 2)), pal.accent)
    t.pad_right(max(0, half - t.cell_len))
    rate = list(state.rate)
    label = f"{rate[-1]:.2f} it/s " if rate else "it/s N/A "
    t.append(label, pal.bold)
    t.append(spark(rate, max(0, width - t.cell_len - 1), 0), pal.ok)
    return t


# ---------------------------------------------------------------- widgets

class TextPanel(Static):
    """A Static that remembers the plain text it shows (what tests and `status_text` compare)."""
    plain = ""
    _shown: Text | None = None

    def set(self, text: Text) -> None:
        if text == self._shown:       # same words and styles: skip the relayout
            return
        self._shown = text
        self.plain = text.plain
        self.update(text)


class Header(TextPanel):
    pass


class GpuPanel(TextPanel):
    """All GPUs, one line each (the container around it scrolls when there are many)."""

    def show(self, state: ViewState, width: int, pal: Palette) -> None:
        sample = state.latest_sample
        if sample is None:
            self.set(Text("waiting for GPU metrics…", style=pal.muted))
            return
        if not sample.get("available"):
            reason = sample.get("reason") or "no GPU metrics on this machine"
            t = Text(no_wrap=False)
            t.append("No GPU metrics on this machine", pal.warn + pal.bold)
            detail = reason.split("(", 1)[1].rstrip(")") if "(" in reason else ""
            if detail:
                t.append(f" ({detail})", pal.muted)
            t.append("; logs, progress and control still work.", pal.muted)
            self.set(t)
            return
        gpus = sample.get("gpus") or []
        names = sorted({g.get("name") or "GPU" for g in gpus})
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f"{len(gpus)} × {', '.join(names)}", pal.bold)
        title.append("   util · memory GiB · power · temp · util 60 s", pal.muted)
        if any(includes_reserve(g) for g in gpus):
            title.append("   * with the driver's reserve (nvidia-smi leaves it out)", pal.muted)
        lines = [title] + [gpu_line(g, state.util_history(g.get("index")), width, pal) for g in gpus]
        self.set(Text("\n").join(lines))


class TrainLine(TextPanel):
    pass


KIND_LABELS = {   # launch/classify.py's kinds, as a person would say them
    "python_exception": "Python exception", "cuda_oom": "CUDA out of memory",
    "nccl_abort": "NCCL watchdog abort", "oom_killed": "killed (host out of memory?)",
    "collateral": "terminated as collateral", "signal": "killed by a signal", "stall": "stalled",
    "unknown": "failed",
}


class FailurePanel(TextPanel):
    def show(self, c: dict[str, Any], pal: Palette) -> None:
        t = Text()
        kind = str(c.get("kind") or "unknown")
        t.append("✗ ", pal.err + pal.bold)
        t.append(KIND_LABELS.get(kind, kind.replace("_", " ")), pal.err + pal.bold)
        if c.get("rank") is not None:
            t.append(f" on rank {c['rank']}", pal.err + pal.bold)
        bits = []
        if c.get("exit_code") is not None:
            bits.append(f"exit code {c['exit_code']}")
        if c.get("signal"):
            bits.append(f"signal {c['signal']}")
        if bits:
            t.append(f" ({', '.join(bits)})", pal.muted)
        if c.get("summary"):
            t.append("\n" + str(c["summary"]))
        if c.get("hint"):
            t.append("\nhint: ", pal.bold)
            t.append(str(c["hint"]))
        if c.get("next_rung"):
            t.append("\nnext rung: ", pal.bold)
            t.append(str(c["next_rung"]))
        if c.get("suggested_command"):
            t.append("\ntry: ", pal.bold)
            t.append(str(c["suggested_command"]), pal.accent)
        if c.get("resume_command"):
            t.append("\nthen: ", pal.bold)
            t.append(str(c["resume_command"]), pal.accent)
        tail = c.get("log_tail") or []
        if tail:
            t.append(f"\n── last {len(tail)} lines of rank {c.get('rank', '?')} ──", pal.muted)
            for line in tail:
                t.append("\n" + str(line))
        self.set(t)


class LogPane(ScrollView, can_focus=True):
    """Rank logs interleaved (or one rank), bounded, with follow/pause and search highlights.

    A line-API widget: only the visible lines are rendered, so 5,000 lines cost nothing per
    frame, and filtering or searching never re-renders the whole buffer.
    """

    def __init__(self, max_lines: int = LOG_PANE_LINES, **kw: Any) -> None:
        super().__init__(**kw)
        self.max_lines = max_lines
        self.entries: list[LogLine] = []
        self.view: list[LogLine] = []
        self.rank: int | None = None          # None: all ranks
        self.follow = True
        self.pattern: str | None = None
        self.matches: list[int] = []           # indices into self.view
        self.current: int | None = None        # index into self.matches
        self._width = 0
        self._pal: Palette | None = None

    # --- data
    def _visible(self, line: LogLine) -> bool:
        return self.rank is None or line.rank == self.rank or line.rank == WIZARD

    def add(self, lines: list[LogLine]) -> None:
        if not lines:
            return
        self.entries.extend(lines)
        if len(self.entries) > self.max_lines:
            del self.entries[: len(self.entries) - self.max_lines]
            self._rebuild()
        else:
            for line in lines:
                if self._visible(line):
                    self._append_view(line)
        self._resize()
        if self.follow:
            self._to_end()
        self.refresh()

    def _to_end(self) -> None:
        # after the refresh, so the new virtual size is known
        self.call_after_refresh(self.scroll_end, animate=False, immediate=True, x_axis=False)

    def _append_view(self, line: LogLine) -> None:
        self.view.append(line)
        self._width = max(self._width, len(self._tag(line.rank)) + len(line.text))
        if self.pattern and self.pattern in line.text.lower():
            self.matches.append(len(self.view) - 1)

    def _rebuild(self) -> None:
        self.view, self.matches, self._width = [], [], 0
        for line in self.entries:
            if self._visible(line):
                self._append_view(line)
        if self.current is not None and self.current >= len(self.matches):
            self.current = len(self.matches) - 1 if self.matches else None

    def _resize(self) -> None:
        self.virtual_size = Size(min(self._width, 2000), len(self.view))

    def set_rank(self, rank: int | None) -> None:
        self.rank = rank
        self.current = None
        self._rebuild()
        self._resize()
        if self.follow:
            self._to_end()
        self.refresh()

    def set_follow(self, follow: bool) -> None:
        self.follow = follow
        if follow:
            self._to_end()

    # --- search
    def search(self, pattern: str | None) -> int:
        self.pattern = pattern.lower() if pattern else None
        self._rebuild()
        self.current = None
        if self.matches:
            self.follow = False
            self.jump(len(self.matches) - 1)          # newest match first
        self.refresh()
        return len(self.matches)

    def jump(self, i: int) -> None:
        if not self.matches:
            return
        self.current = i % len(self.matches)
        y = self.matches[self.current]
        self.scroll_to(y=max(0, y - self.size.height // 2), animate=False, immediate=True)
        self.refresh()

    def next_match(self, delta: int) -> None:
        if self.matches:
            self.follow = False
            self.jump((self.current if self.current is not None else -1 if delta > 0 else 0) + delta)

    # --- rendering
    @staticmethod
    def _tag(rank: int) -> str:
        if rank == LAUNCHER:
            return "[L] "
        if rank == WIZARD:
            return "[*] "
        return f"[{rank}] "

    def on_mount(self) -> None:
        self._pal = Palette(self.app)

    def palette_changed(self) -> None:
        self._pal = Palette(self.app)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        idx = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if idx >= len(self.view):
            return Strip.blank(width, style)
        pal = self._pal or Palette(self.app)
        line = self.view[idx]
        text = Text(no_wrap=True, end="")
        text.append(self._tag(line.rank), pal.rank(line.rank))
        body_start = len(text)
        text.append(line.text)
        if self.pattern:
            is_current = self.current is not None and self.matches and self.matches[self.current] == idx
            hl = pal.current_match if is_current else pal.match
            low = line.text.lower()
            start = low.find(self.pattern)
            while start >= 0:
                text.stylize(hl, body_start + start, body_start + start + len(self.pattern))
                start = low.find(self.pattern, start + max(1, len(self.pattern)))
        text.stylize_before(style, 0, len(text))
        strip = Strip(text.render(self.app.console), text.cell_len)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, idx)

    def on_mouse_scroll_up(self, event: events.MouseScrollUp) -> None:
        self.follow = False            # scrolling back through history pauses following


class QuitModal(ModalScreen[str]):
    """Quitting the view of a run this view started: stop it, leave it running, or stay."""

    BINDINGS = [Binding("escape", "dismiss_with('cancel')", "Cancel"),
                Binding("s", "dismiss_with('stop')", "Stop run"),
                Binding("l", "dismiss_with('detach')", "Leave running")]

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-dialog"):
            yield Label("The run is still going. Stop it before quitting?", id="quit-question")
            with Horizontal(id="quit-buttons"):
                yield Button("Stop run (s)", id="stop", variant="error")
                yield Button("Leave running (l)", id="detach", variant="primary")
                yield Button("Cancel (esc)", id="cancel")

    def action_dismiss_with(self, choice: str) -> None:
        self.dismiss(choice)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")


class RunViewApp(App[str]):
    CSS_PATH = "view.tcss"
    TITLE = "wizard launch"

    BINDINGS = [
        Binding("s", "stop", "Stop"),
        Binding("r", "restart", "Restart"),
        Binding("d", "detach", "Detach"),
        Binding("q", "quit_view", "Quit"),
        Binding("slash", "search", "Search"),
        Binding("f", "toggle_follow", "Follow"),
        Binding("space", "toggle_follow", "Follow", show=False),
        Binding("a", "rank(-1)", "All"),
        Binding("n", "next_match(1)", "Next", show=False),
        Binding("N", "next_match(-1)", "Prev", show=False),
        Binding("escape", "close_search", "Close search", show=False),
        Binding("question_mark", "keys", "Keys", show=False),
        Binding("ctrl+c", "quit_view", "Quit", show=False, priority=True),
    ] + [Binding(str(i), f"rank({i})", f"Rank {i}", show=False) for i in range(10)]

    def __init__(self, run_dir: Path, *, owned: bool, follow_interval: float = 0.5,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.owned = owned
        self.follow_interval = follow_interval
        self.clock = clock
        self.follower = RunFollower(self.run_dir)
        self.state = ViewState()
        self.pal = Palette(None)
        self._message: tuple[str, float | None] | None = None   # (text, expires_at)
        self._stop_sent_at: float | None = None
        self._restart_armed_at: float | None = None
        self.last_control = None
        self._lost_check_running = False
        self._detach_deadline: float | None = None
        self._failure_seen = False
        self.poll_errors = 0

    # --- layout
    def compose(self) -> ComposeResult:
        yield Header(id="header")
        with VerticalScroll(id="failure"):
            yield FailurePanel(id="failure-panel")
        with VerticalScroll(id="gpus"):
            yield GpuPanel(id="gpu-panel")
        yield TrainLine(id="train")
        yield LogPane(id="log")
        yield Input(placeholder="search logs (Enter: find, Esc: close; n/N: next/previous)", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.pal = Palette(self)
        self.query_one("#failure").display = False
        self.query_one("#search").display = False
        self.query_one(LogPane).focus()
        self.poll()
        self.set_interval(self.follow_interval, self.poll)
        self.theme_changed_signal.subscribe(self, self._on_theme)

    def _on_theme(self, _theme: Any) -> None:
        self.pal = Palette(self)
        self.query_one(LogPane).palette_changed()
        self.redraw()

    # --- data
    def poll(self) -> None:
        try:
            self._poll()
        except Exception as exc:         # the view must survive whatever a run directory holds; it shows the error
            self.poll_errors += 1
            self._message = (f"view error: {type(exc).__name__}: {exc}", None)

    def _poll(self) -> None:
        self._check_supervisor()
        u = self.follower.poll()
        if not u and not self._has_live_text():
            return
        self.state.apply(u, self.follower.run)
        if u.lines:
            self.query_one(LogPane).add(u.lines)
        # redraw only what changed: the header every tick (elapsed time), the rest on new data
        self.redraw(gpus=bool(u.samples), train=bool(u.events), failure=u.run_changed)

    def _check_supervisor(self) -> None:
        """A run.json that says active while its supervisor is gone is a lost run: declare it (in a
        thread: ending leftovers waits up to a few seconds) so the view never shows a dead run as
        running."""
        run = self.follower.run
        if not run or run.get("status") not in ACTIVE_STATUSES or self._lost_check_running:
            return
        if state_problem(run) or supervisor_alive(run):
            return              # a run.json that is not valid is never rewritten
        self._lost_check_running = True

        def work() -> None:
            try:
                mark_lost_if_dead(self.run_dir, by="the launch view")
            finally:
                self._lost_check_running = False
        self.run_worker(work, thread=True, exclusive=False, group="lost")

    def _has_live_text(self) -> bool:
        # elapsed time and countdowns move even when no file changed
        return self.state.active or self._message is not None

    def redraw(self, gpus: bool = True, train: bool = True, failure: bool = True) -> None:
        now = self.clock()
        width = max(20, self.size.width - 2)
        self.query_one(Header).set(header_lines(self.state, now, width, self._header_message(now), self.pal))
        if gpus:
            self.query_one(GpuPanel).show(self.state, max(20, self.size.width - 3), self.pal)
        if train:
            self.query_one(TrainLine).set(train_line(self.state, width, self.pal))
        if not failure:
            return
        c = self.state.run.get("classification")
        self.query_one("#failure").display = bool(c)
        self.set_class(bool(c), "-failed")
        if c:
            self.query_one(FailurePanel).show(c, self.pal)
            if not self._failure_seen and isinstance(c.get("rank"), int):
                # once: point the log pane at the rank that failed (digits / 'a' change it)
                self._failure_seen = True
                self.query_one(LogPane).set_rank(c["rank"])
                self._update_log_title()

    def _header_message(self, now: float) -> str | None:
        if self._stop_sent_at is not None:
            if not self.state.active:
                self._stop_sent_at = None
            else:
                grace = as_number(self.state.run.get("grace_s")) or as_number(self.state.run.get("grace_period_s")) or DEFAULT_GRACE_S
                left = grace - (now - self._stop_sent_at)
                if left > 0:
                    return f"stopping: kill in {left:.0f} s (s: now)"
                return "stopping: grace period over, killing"
        if self._message is not None:
            text, expires = self._message
            if expires is None or now < expires:
                return text
            self._message = None
        if self.state.status == "lost":
            return (f"supervisor {self.state.run.get('supervisor_pid')} is gone: the run is lost; "
                    f"ended {len(self.state.run.get('lost_cleaned') or [])} leftover processes. q to quit")
        if self.state.status in FINISHED:
            return "run finished: q to quit"
        return None

    def flash(self, text: str, seconds: float | None = 5.0) -> None:
        now = self.clock()
        self._message = (text, None if seconds is None else now + seconds)
        self.redraw(gpus=False, train=False, failure=False)

    # --- actions
    def _control(self, request: str) -> bool:
        result = send_control(self.run_dir, request, self.follower.run or None, now=self.clock)
        self.last_control = result
        self.flash(result.message)
        return result.written or result.signalled

    def action_stop(self) -> None:
        if not self.state.active:
            self.flash(f"the run has already {self.state.status}")
            return
        if self._stop_sent_at is None:
            if self._control("stop"):
                self._stop_sent_at = self.clock()
                self._message = None
                self.redraw()
        else:
            self._control("kill")
            self._stop_sent_at = None

    def action_restart(self) -> None:
        if not self.state.active:
            self.flash(f"the run has already {self.state.status}; nothing to restart")
            return
        now = self.clock()
        if self._restart_armed_at is not None and now - self._restart_armed_at < 5.0:
            self._restart_armed_at = None
            self._control("restart")
        else:
            # restarting throws away the current attempt: ask for a second press
            self._restart_armed_at = now
            self.flash("press r again to restart the run (new attempt)")

    def action_detach(self) -> None:
        self._detach_and_exit()

    def _detach_and_exit(self) -> None:
        """A run this view started ends with the view unless the supervisor is told to detach
        first: ask it, and leave once run.json says it did (checked on every poll; after 5 s
        without an answer, say so and stay)."""
        run = self.follower.run or {}
        if not self.owned or not self.state.active or run.get("detached") or not supervisor_alive(run):
            self.exit(DETACHED)
            return
        self._control("detach")
        self._detach_deadline = time.monotonic() + 5.0
        self.set_timer(0.1, self._detach_confirmed)

    def _detach_confirmed(self) -> None:
        if self._detach_deadline is None:
            return
        st = read_state(self.run_dir) or {}
        if st.get("detached") or st.get("status") not in ACTIVE_STATUSES:
            self._detach_deadline = None
            self.exit(DETACHED)
        elif time.monotonic() > self._detach_deadline:
            self._detach_deadline = None
            self.flash("detach not confirmed: the run ends with this view", None)
        else:
            self.set_timer(0.1, self._detach_confirmed)

    def action_keys(self) -> None:
        """`?`: the view's keys, in the header (stays until the next message)."""
        self.flash("s stop (again: kill)  r r restart  d detach  q quit  / search  n/N next/prev  "
                   "f follow  0-9 rank  a all ranks  ? keys", 15.0)

    def action_quit_view(self) -> None:
        if self.owned and self.state.active and not self.state.run.get("detached"):
            self.push_screen(QuitModal(), self._after_quit_modal)
        else:
            self.exit(QUIT)

    async def action_quit(self) -> None:
        # ctrl+q (Textual's own quit key) asks the same question as q
        self.action_quit_view()

    def _after_quit_modal(self, choice: str | None) -> None:
        if choice == "stop":
            self._control("stop")
            self.exit(STOPPED)
        elif choice == "detach":
            self._detach_and_exit()

    def action_rank(self, rank: int) -> None:
        pane = self.query_one(LogPane)
        pane.set_rank(None if rank < 0 else rank)
        self._update_log_title()

    def action_toggle_follow(self) -> None:
        pane = self.query_one(LogPane)
        pane.set_follow(not pane.follow)
        self._update_log_title()

    def action_search(self) -> None:
        box = self.query_one("#search", Input)
        box.display = True
        box.focus()

    def action_close_search(self) -> None:
        box = self.query_one("#search", Input)
        if box.display:
            box.display = False
            self.query_one(LogPane).focus()
        elif self.query_one(LogPane).pattern:
            self.query_one(LogPane).search(None)
            self._update_log_title()

    def action_next_match(self, delta: int) -> None:
        self.query_one(LogPane).next_match(delta)
        self._update_log_title()

    @on(Input.Submitted, "#search")
    def _search(self, event: Input.Submitted) -> None:
        pane = self.query_one(LogPane)
        pane.search(event.value.strip() or None)
        event.input.display = False
        pane.focus()
        self._update_log_title()

    def _update_log_title(self) -> None:
        pane = self.query_one(LogPane)
        parts = ["all ranks" if pane.rank is None else f"rank {pane.rank}",
                 "following" if pane.follow else "paused"]
        if pane.pattern:
            n = len(pane.matches)
            where = f"{pane.current + 1}/{n}" if pane.current is not None and n else f"{n}"
            parts.append(f"/{pane.pattern}/ {where} matches")
        pane.border_title = " · ".join(parts)

    def on_ready(self) -> None:
        self._update_log_title()

    def on_unmount(self) -> None:
        self.follower.close()

    def on_resize(self, event: events.Resize) -> None:
        self.redraw()


# ---------------------------------------------------------------- entry points

def make_view_app(run_dir: str | os.PathLike[str], *, owned: bool, follow_interval: float = 0.5,
                  clock: Callable[[], float] = time.time):
    """The Textual app for RUN_DIR. `owned`: this process started the run (quitting asks whether
    to stop it). `clock` is injectable so snapshots can freeze elapsed times."""
    return RunViewApp(Path(run_dir), owned=owned, follow_interval=follow_interval, clock=clock)


def exit_code_for(result: str | None, run: dict[str, Any] | None, owned: bool) -> int:
    if result == STOPPED:
        return 130
    if result == DETACHED or not owned or not run:
        return 0
    if run.get("status") in FINISHED:
        code = _as_int(run.get("exit_code"))
        if code is not None:
            return code
        return 0 if run.get("status") == "succeeded" else 1
    return 0


def reattach_hint(run_dir: str | os.PathLike[str]) -> str:
    return (f"The run goes on. Re-attach with:  wizard attach {run_dir}\n"
            f"Stop it with:                   wizard stop {run_dir}")


def run_view(run_dir: str | os.PathLike[str], *, owned: bool) -> int:
    """Show the live view until the user quits or detaches; returns the process exit code.

    Without a terminal (stdin and stdout must both be TTYs; Textual would otherwise draw escape
    codes into a pipe) it prints the run's status once instead and returns 0.
    """
    run = read_state(run_dir)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print(status_text(run) if run else f"no run.json in {run_dir}")
        return 0 if run else 2
    app = make_view_app(run_dir, owned=owned)
    result = app.run()
    run = read_state(run_dir) or run
    if result != STOPPED and run and run.get("status") in ACTIVE:
        print(reattach_hint(run_dir))
    elif result == STOPPED:
        print(f"Stop requested; the supervisor is ending the run. Follow it with: wizard attach {run_dir}")
    return exit_code_for(result, run, owned)
