"""The plan's rungs as horizontal bars of per-GPU memory, stacked by component, against the GPU's capacity.

Rich renderables sized at render time (they take the width they are given), so the same rung
list reads at 80 and at 200 columns. Colours are Tableau's 10: distinct in truecolor, after the
downgrade to 256 colours, and on both light and dark backgrounds; the legend names them. Colour is
never the only cue: each component's cells carry its letter (P params, G grads, ...), as in the legend.
"""

from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.padding import Padding
from rich.style import Style
from rich.text import Text

from wizard.frontends.tui.words import in_words
from wizard.planning.plan import COMPONENTS, Plan, Rung
from wizard.planning.rungs import BY_KEY
from wizard.planning.speed import fmt_rate
from wizard.units import fmt_bytes

COLOURS = {
    "parameters": "#1f77b4",
    "gradients": "#ff7f0e",
    "optimizer": "#2ca02c",
    "autocast": "#17becf",
    "activations": "#9467bd",
    "logits": "#8c564b",
    "buffers": "#e377c2",
    "context": "#7f7f7f",
    "margin": "#bcbd22",
}
LEGEND_NAMES = {
    "parameters": "params", "gradients": "grads", "optimizer": "optim", "autocast": "amp",
    "activations": "activ",
    "logits": "logits", "buffers": "buf", "context": "ctx", "margin": "margin",
}
LETTERS = {
    "parameters": "P", "gradients": "G", "optimizer": "O", "autocast": "H", "activations": "A",
    "logits": "L", "buffers": "B", "context": "C", "margin": "M",
}


def letter_style(colour: str) -> Style:
    """The component's colour as the background, its letter in black or white, whichever reads better."""
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    light = 0.299 * r + 0.587 * g + 0.114 * b > 140
    return Style(color="#000000" if light else "#ffffff", bgcolor=colour)
LABEL_WIDTH = 17       # the narrowest label column; a plan with longer names widens it (label_width)
MIN_BAR = 12           # the bar gives up cells to the names down to this
FIGURE_WIDTH = 12       # " 160.9 GiB ✗"
SPEED_WIDTH = 12        # " 12.3k tok/s"
TRACK = "·"
OVERFLOW = "»"
CAPACITY_MARK = "┃"
MAX_SCALE = 2.0         # beyond twice the capacity the bar is cut (and says so with »)


def short_name(rung: Rung) -> str:
    spec = BY_KEY.get(rung.key)
    # A rung the plan renamed (one CPU process is "Single process") keeps its own name.
    name = spec.short if spec is not None and rung.name == spec.label else rung.name
    code = "+code" if rung.checkpoint_offload or rung.tiled_mlp else ""
    return name + (" +GC" + code if rung.gradient_checkpointing else (" " + code if code else ""))


def label_width(plan: Plan) -> int:
    """The label column for this plan: its longest rung name (with " +GC") and a space, at least LABEL_WIDTH."""
    return max([LABEL_WIDTH] + [len(short_name(r)) + 1 for r in plan.rungs])


def fit_label(label: str, room: int) -> str:
    """The label in `room` cells; cut before its " +GC" (never through it) when it must be cut."""
    if len(label) <= room:
        return label
    at = label.rfind(" +")
    base, gc = (label[:at], label[at:]) if at > 0 and label[at:].startswith((" +GC", " +code")) else (label, "")
    return base[:max(1, room - len(gc) - 1)] + "…" + gc


def plan_scale(plan: Plan) -> int:
    """Bytes the full bar width stands for: the capacity, or the largest rung up to twice it."""
    capacity = max(1, plan.gpu_capacity_bytes)
    biggest = max((r.per_gpu_bytes for r in plan.rungs), default=0)
    return int(min(max(capacity, biggest), capacity * MAX_SCALE))


def bar(rung: Rung, capacity: int, scale: int, width: int) -> Text:
    """`width` cells: one coloured run per component (COMPONENTS order), the rest a track up to
    the capacity mark; cut with » when the rung needs more than `scale`."""
    width = max(4, width)
    cells: list[tuple[str, str | None]] = []
    total = 0
    for name in COMPONENTS:
        size = rung.breakdown.get(name, 0)
        if not size:
            continue
        start = round(total / scale * width)
        total += size
        end = min(width, round(total / scale * width))
        cells += [(LETTERS[name], COLOURS[name])] * max(0, end - start)
    overflow = total > scale
    cells = cells[:width]
    cap_at = min(width - 1, max(0, round(capacity / scale * width) - 1))
    while len(cells) < width:
        cells.append((TRACK if len(cells) <= cap_at else " ", None))
    if overflow:
        cells[-1] = (OVERFLOW, "bold red")
    text = Text()
    for i, (char, colour) in enumerate(cells):
        if i == cap_at and char != OVERFLOW and capacity < scale:
            text.append(CAPACITY_MARK, Style(bold=True, bgcolor=colour) if colour else Style(bold=True))
        elif colour is None:
            text.append(char, Style(dim=True))
        elif char == OVERFLOW:
            text.append(char, colour)
        else:
            text.append(char, letter_style(colour))
    return text


def legend(plan: Plan | None = None) -> Text:
    text = Text()
    for i, name in enumerate(COMPONENTS):
        text.append(f"{' ' if i else ''}")
        text.append(LETTERS[name], letter_style(COLOURS[name]))
        text.append(f" {LEGEND_NAMES[name]}")
    if plan is not None:
        text.append(f" {CAPACITY_MARK}{fmt_bytes(plan.gpu_capacity_bytes)}", Style(bold=True))
    text.rstrip()
    return text


class RungRow:
    """One rung: marker, short name, bar and figure on the first line; why, wrapped, below."""

    def __init__(self, rung: Rung, plan: Plan, *, chosen: bool, picked: bool = False,
                 ladder_choice: bool = False, labels: int | None = None) -> None:
        self.rung = rung
        self.plan = plan
        self.chosen = chosen
        self.picked = picked
        self.ladder_choice = ladder_choice      # the ladder's own choice, overridden by a pick
        self.labels = labels or label_width(plan)   # the same column for every row of the list

    def head(self, width: int) -> Text:
        r = self.rung
        mark = "▶ " if self.chosen else "  "
        # The names take what they need from the bar, down to MIN_BAR cells; only below that are they cut.
        column = max(LABEL_WIDTH, min(self.labels, width - len(mark) - FIGURE_WIDTH - SPEED_WIDTH - MIN_BAR))
        label = fit_label(short_name(r), column - 1)
        line = Text(mark, Style(bold=True))
        line.append(f"{label:<{column}}", Style(bold=self.chosen))
        bar_width = max(4, width - len(mark) - column - FIGURE_WIDTH - SPEED_WIDTH)
        line.append_text(bar(r, self.plan.gpu_capacity_bytes, plan_scale(self.plan), bar_width))
        verdict = Text(" ✓", "green") if r.fits else Text(" ✗", "red")
        line.append(f" {fmt_bytes(r.per_gpu_bytes):>9}")
        line.append_text(verdict)
        rate = fmt_rate(r.tokens_per_second) if r.speed is not None else ""
        line.append(f" {rate:>{SPEED_WIDTH - 1}}", Style(bold=self.chosen, dim=not r.fits))
        return line

    def why(self) -> Text:
        r = self.rung
        text = Text()
        prefix = ""
        if self.chosen and self.picked:
            prefix = "Your pick. " if r.fits else "Your pick, and it does NOT fit: expect out-of-memory. "
        elif self.chosen:
            prefix = "Chosen. "
        elif self.ladder_choice:
            prefix = "The ladder's choice. "
        text.append(prefix, Style(bold=True, color="red" if (self.picked and not r.fits) else None))
        text.append(f"{r.name}: ", Style(italic=True))
        text.append(in_words(r.reason))
        if r.cpu_bytes and (r.offload_optimizer != "none" or r.offload_param != "none"):
            text.append(f" Host RAM {fmt_bytes(r.cpu_bytes)}.")
        return text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.head(options.max_width)
        why = self.why()
        why.stylize(Style(dim=not self.chosen))
        yield Padding(why, (0, 0, 0, 4))
