"""The ladder as a list: one option per rung (memory bar + why), the chosen one marked and highlighted."""

from __future__ import annotations

from textual.widgets import OptionList
from textual.widgets.option_list import Option

from wizard.frontends.tui.widgets.memory_bar import RungRow
from wizard.planning.plan import Plan


class RungList(OptionList):
    """Up/down move between rungs; Enter picks the highlighted rung (the screen decides what that means)."""

    DEFAULT_CSS = """
    RungList { height: auto; max-height: 100%; border: none; padding: 0; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._signature: tuple | None = None

    def show_plan(self, plan: Plan | None, picked: str | None, ladder_choice: str | None = None) -> None:
        """Rebuild the options when the plan changed; keep the highlight on the chosen rung. `ladder_choice`: the
        rung the ladder chose itself (WizardState.ladder_choice), marked as such when another was picked."""
        if plan is None:
            self._signature = None
            self.clear_options()
            return
        chosen = plan.choice.key if plan.choice is not None else None
        signature = (tuple((r.key, r.per_gpu_bytes, r.fits, r.reason, r.gradient_checkpointing, r.tokens_per_second)
                           for r in plan.rungs),
                     chosen, picked, ladder_choice, plan.gpu_capacity_bytes)
        if signature == self._signature:
            return
        self._signature = signature
        highlighted = self.highlighted
        keep = self.get_option_at_index(highlighted).id if highlighted is not None and self.option_count else None
        self.clear_options()
        ladder = ladder_choice if picked else None
        self.add_options([Option(RungRow(r, plan, chosen=r.key == chosen, picked=r.key == picked,
                                         ladder_choice=r.key == ladder and r.key != chosen), id=r.key)
                          for r in plan.rungs])
        keys = [r.key for r in plan.rungs]
        target = chosen if chosen in keys else keep if keep in keys else (keys[0] if keys else None)
        if target is not None:
            self.highlighted = keys.index(target)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        # An empty ladder (no plan) has nothing to select: Enter goes on to the screen's own Next.
        if action == "select" and not self.option_count:
            return False
        return super().check_action(action, parameters)

    @property
    def highlighted_key(self) -> str | None:
        if self.highlighted is None or not self.option_count:
            return None
        return self.get_option_at_index(self.highlighted).id
