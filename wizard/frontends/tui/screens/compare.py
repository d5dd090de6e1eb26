"""The Plan screen's Compare (`c`): `wizard compare` for the answers on screen, over the default machine set.

A table of the same figures as the CLI (the plan's choice, micro-batch x accumulation, gradient checkpointing,
tokens/s, the time to train and the cost), a bar chart of time and cost per machine that fits, and a prices field
(per GPU-hour, as `--price` takes them: re-pricing plans nothing again). The comparison runs in a thread
(wizard.compare, the CLI's code). Enter on a row plans for that machine (the Hardware screen's "another machine",
with two machines for a 2 x 8 row); Escape goes back to the plan unchanged.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label, Static

from wizard import compare as compare_mod
from wizard.frontends.tui.words import in_words
from wizard.units import fmt_duration

BAR = "█"
BAR_EMPTY = "░"
CHART_LABEL = 15            # the machine column of the chart
CHART_ROWS_MIN = 3          # the chart's rows at 80x24; more where the terminal is taller


def bar(value: float, most: float, width: int) -> str:
    """`value` of `most` as a bar `width` cells wide: at least one cell for any value above zero."""
    if width <= 0 or most <= 0:
        return ""
    filled = max(1, round(value / most * width)) if value > 0 else 0
    return BAR * filled + BAR_EMPTY * (width - filled)


money = compare_mod.fmt_cost     # one format for the table and the screen


def chart_lines(comparison: compare_mod.Comparison, width: int, rows: int) -> list[str]:
    """Time and cost per machine that fits, in the table's order, as bars against the longest and the dearest of
    those shown (against every machine, the fast ones would be one cell each beside a slow one's weeks):
    'machine  time ████░░ 14h 17m  cost ██░░░░ $72'. `rows` machines at most."""
    fitting = [r for r in comparison.rows if r.fits and r.train_seconds]
    if not fitting:
        return ["Nothing fits on these machines with these answers."]
    shown = fitting[:max(rows, 1)]
    longest = max(r.train_seconds for r in shown)
    costs = [r.cost for r in shown if r.cost is not None]
    dearest = max(costs) if costs else 0.0
    time_text = max(len(fmt_duration(r.train_seconds)) for r in shown)
    cost_text = max(len(money(r.cost, comparison.currency)) for r in shown)
    # label, "time " bar " " text, "  cost " bar " " text
    room = width - CHART_LABEL - len("time ") - 1 - time_text - (len("  cost ") + 1 + cost_text if costs else 0)
    bar_width = max(room // (2 if costs else 1), 4)
    out = []
    for r in shown:
        line = (f"{r.machine.label[:CHART_LABEL - 1]:<{CHART_LABEL}}time {bar(r.train_seconds, longest, bar_width)} "
                f"{fmt_duration(r.train_seconds):>{time_text}}")
        if costs:
            line += (f"  cost {bar(r.cost or 0.0, dearest, bar_width)} "
                     f"{money(r.cost, comparison.currency):>{cost_text}}")
        out.append(line)
    if len(fitting) > len(shown):
        out.append(f"[dim]... and {len(fitting) - len(shown)} more that fit (the table has them all)[/dim]")
    return out


def row_cells(r: compare_mod.Row, currency: str = "") -> tuple[str, ...]:
    """mark, machine, plan, micro x acc, tokens/s, time, cost."""
    from wizard.frontends.tui.widgets.memory_bar import short_name
    from wizard.planning.speed import fmt_rate
    mark = ("F" if r.fastest else "") + ("C" if r.cheapest else "")
    if r.error:
        return (mark, r.machine.label, "cannot plan", "", "", "", "")
    if not r.fits:
        by = f" by {(r.short_by - 1) * 100:.0f}%" if r.short_by and r.short_by > 1 else ""
        return (mark, r.machine.label, f"does not fit{by}", "", "", "", "")
    choice = r.result.plan.choice if r.result is not None else None
    plan = short_name(choice) if choice is not None else (r.rung or "")
    if r.measured:
        plan += " (measured)"
    return (mark, r.machine.label, plan, f"{r.micro_batch}x{r.grad_accum}",
            fmt_rate(r.tokens_per_second or 0).replace(" tok/s", ""),
            fmt_duration(r.train_seconds) if r.train_seconds else "-", money(r.cost, currency))


COLUMNS = ("", "machine", "plan", "mb×acc", "tok/s", "time", "cost")


def comparison_given(state) -> dict[str, Any]:
    """The answers on screen, without the machine's own (each row is its own machine)."""
    given = state.given()
    return {k: v for k, v in given.items() if k not in compare_mod.MACHINE_QUESTIONS}


class CompareScreen(Screen[Any]):
    """Dismissed with the chosen compare.Machine, or None (Escape)."""

    BINDINGS = [Binding("escape", "close", "Back to the plan"),
                Binding("enter", "choose", "Plan for this machine", key_display="⏎", show=True)]

    DEFAULT_CSS = """
    CompareScreen { layout: vertical; }
    CompareScreen #compare-title { height: 1; background: $primary; color: $text; text-style: bold; }
    CompareScreen #compare-prices-row { height: 1; }
    CompareScreen #compare-prices-row Label { width: auto; padding: 0 1 0 0; }
    CompareScreen #compare-prices { width: 1fr; }
    CompareScreen #compare-caveat { height: auto; color: $text-muted; }
    CompareScreen #compare-table { height: 1fr; }
    CompareScreen #compare-chart { height: auto; }
    CompareScreen #compare-status { height: auto; }
    """

    def __init__(self, state, machines: list[compare_mod.Machine] | None = None) -> None:
        super().__init__()
        self.state = state
        self.machines = machines if machines is not None else compare_mod.default_machines()
        self.planned: compare_mod.Comparison | None = None     # at no prices
        self.comparison: compare_mod.Comparison | None = None  # at the prices typed
        self.prices = compare_mod.Prices()

    def compose(self) -> ComposeResult:
        yield Static(" Compare machines: the same answers planned for each", id="compare-title")
        with Horizontal(id="compare-prices-row"):
            yield Label("Prices per GPU-hour")
            yield Input(placeholder="e.g. H100-80GB=2.5,8xA100-80GB=1.8 (Enter)", id="compare-prices", compact=True)
        yield Static(escape(compare_mod.CAVEAT), id="compare-caveat")
        table: DataTable = DataTable(id="compare-table", cursor_type="row", zebra_stripes=False)
        yield table
        yield Static("", id="compare-chart")
        yield Static(f"Planning {len(self.machines)} machines ...", id="compare-status")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(*COLUMNS)
        table.focus()
        self.run_worker(self._plan_all, thread=True, exclusive=True, group="compare", exit_on_error=False)

    def _plan_all(self) -> None:
        from wizard.errors import InputError
        try:
            result = compare_mod.compare(comparison_given(self.state), self.machines,
                                         calibrate=self.state.request.calibrate)
        except InputError as e:
            self.app.call_from_thread(self._failed, str(e))
            return
        self.app.call_from_thread(self._planned, result)

    def _failed(self, message: str) -> None:
        self.query_one("#compare-status", Static).update(f"[red]✗ {escape(in_words(message))}[/red]")

    def _planned(self, result: compare_mod.Comparison) -> None:
        self.planned = result
        self._show(compare_mod.priced(result, self.prices))

    def _show(self, comparison: compare_mod.Comparison) -> None:
        self.comparison = comparison
        table = self.query_one(DataTable)
        row = table.cursor_row if table.row_count else 0
        table.clear()
        for r in comparison.rows:
            table.add_row(*row_cells(r, comparison.currency), key=r.machine.label)
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))
        self._show_chart()
        self._show_status()

    def _chart_rows(self) -> int:
        """Fewer chart lines on a short terminal: the table keeps at least its header and a few rows."""
        return CHART_ROWS_MIN + max(0, (self.app.size.height - 24) // 2)

    def _show_chart(self) -> None:
        if self.comparison is None:
            return
        width = max(self.app.size.width - 1, 40)
        self.query_one("#compare-chart", Static).update(
            "\n".join(chart_lines(self.comparison, width, self._chart_rows())))

    def _show_status(self) -> None:
        c = self.comparison
        if c is None:
            return
        method = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}.get(c.method, c.method)
        tokens = f"{c.train_tokens:,} tokens" if c.tokens_given else "1B tokens (set the tokens on the Model screen)"
        best = []
        if c.fastest:
            best.append(f"F fastest {c.fastest.machine.label}")
        if c.cheapest:
            best.append(f"C cheapest {c.cheapest.machine.label}")
        unpriced = sum(1 for r in c.rows if r.fits and r.cost is None)
        # the CLI names every unpriced machine; here the table shows them ("-"), and the line says how many
        plural = ("s", "") if unpriced != 1 else ("", "s")
        warnings = [w if not w.startswith("no price for ") else
                    f"no price for {unpriced} machine{plural[0]} that fit{plural[1]}" for w in c.warnings]
        self.query_one("#compare-status", Static).update(
            f"{escape(method)} · time and cost for {escape(tokens)}" + (f" · {', '.join(best)}" if best else "")
            + "".join(f"\n[yellow]⚠ {escape(w)}[/yellow]" for w in warnings)
            + "\n[dim]↑↓ machines · Enter plans for that machine · Tab: prices · Escape: back to the plan[/dim]")

    def on_resize(self, event) -> None:
        self._show_chart()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Prices as --price takes them; an empty field clears them."""
        from wizard.errors import InputError
        event.stop()
        text = event.value.strip()
        try:
            prices = compare_mod.Prices(compare_mod.parse_price_flag(text)) if text else compare_mod.Prices()
        except InputError as e:
            self.query_one("#compare-status", Static).update(f"[red]✗ {escape(in_words(str(e)))}[/red]")
            return
        self.prices = prices
        if self.planned is not None:
            self._show(compare_mod.priced(self.planned, prices))
        self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._choose(event.row_key.value if event.row_key is not None else None)

    def action_choose(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        self._choose(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def _choose(self, label: str | None) -> None:
        row = compare_mod.find_row(self.comparison, label) if self.comparison is not None and label else None
        if row is None:
            return
        if row.error:
            self.query_one("#compare-status", Static).update(
                f"[red]✗ {escape(row.machine.label)} cannot be planned with these answers: "
                f"{escape(in_words(row.error))}[/red]")
            return
        self.dismiss(row.machine)

    def action_close(self) -> None:
        self.dismiss(None)


def plan_for_machine(state, m: compare_mod.Machine) -> None:
    """Plan for a chosen row: the Hardware screen's "another machine" (COUNT x GPU of one server) and, for a
    2 x 8 row, two machines (the Details screen then asks the main machine's address)."""
    from wizard.frontends.session import TARGET_OTHER
    if len(m.gpu_names) != 1:
        raise ValueError(f"{m.label}: one GPU model per machine")
    state.set_other_machine(m.gpus // m.nodes, m.gpu_names[0])
    state.set_target(TARGET_OTHER)
    state.set_answer("num_machines", m.nodes if m.nodes > 1 else None)
