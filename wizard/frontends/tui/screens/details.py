"""Screen 4, Details: the 'machines' and 'details' questions, grouped as the table groups them.

Each group is a collapsible; groups whose questions are all rarely needed start collapsed. Only
the questions that apply to the plan's choice are shown (DeepSpeed's for a ZeRO rung, FSDP's for
FSDP, multi-node ones with more than one machine). Machine answers change the topology, so they
re-plan; the other defaults follow the plan's choice.
"""

from __future__ import annotations

from typing import Iterable

from textual.widget import Widget
from textual.widgets import Collapsible, Static

from wizard.config.questions import DETAIL_GROUPS, for_group, for_stage
from wizard.frontends.tui.screens.base import WizardScreen
from wizard.frontends.tui.widgets.question_field import QuestionField

GROUP_TITLES = {
    "machines": "Processes and machines",
    "processes": "Process checks",
    "multinode": "Multi-node (DeepSpeed launcher)",
    "deepspeed": "DeepSpeed",
    "fsdp": "FSDP",
    "parallelism": "Parallelism config (FSDP2)",
    "compile": "Compilation (torch.compile)",
    "precision": "Precision",
}
GROUP_ORDER = ("machines", "precision", "deepspeed", "fsdp", "parallelism", "multinode", "processes", "compile")


def asked_on_details(qid: str | None) -> bool:
    """Whether the question is one of this screen's (the machines and the details): where its error is fixed."""
    from wizard.config.questions import by_id
    try:
        return qid is not None and by_id(qid).stage in ("machines", "details")
    except KeyError:
        return False


def group_questions(group: str):
    if group == "machines":
        return for_stage("machines")
    return tuple(q for q in for_group(group) if q.stage == "details")


class DetailsScreen(WizardScreen):
    STEP = 3
    AUTO_FOCUS = "#q-num_machines"

    def compose_body(self) -> Iterable[Widget]:
        assert set(GROUP_ORDER) == {"machines", *DETAIL_GROUPS}
        for group in GROUP_ORDER:
            questions = group_questions(group)
            collapsed = all(q.advanced for q in questions)
            with Collapsible(title=GROUP_TITLES[group], collapsed=collapsed, id=f"group-{group}",
                             classes="details-group"):
                for q in questions:
                    yield self.make_field(q)
        yield Static("", id="details-plan")

    def screen_help(self) -> str:
        return "The rest of what `accelerate config` asks, pre-filled for the plan's choice. Enter writes nothing yet."

    def sync(self) -> None:
        super().sync()
        for group in GROUP_ORDER:
            box = self.query_one(f"#group-{group}", Collapsible)
            box.display = any(f.display for f in box.query(QuestionField))
        state = self.state
        plan = state.plan
        line = ""
        if plan is not None and plan.choice is not None:
            line = f"Plan: [b]{plan.choice.name}[/b] on {plan.topology.world_size} process(es)"
        self.query_one("#details-plan", Static).update(line)

    def resumed(self) -> None:
        super().resumed()
        # Back from Review: Next has the focus, so Enter goes on again. Shown for the first time: the first field
        # has it (AUTO_FOCUS), so the first Tab goes to the second field, not to Next.
        if getattr(self, "_seen", False):
            self.next_button().focus()
        self._seen = True

    def blocking_problem(self) -> str | None:
        problem = self.plan_needed_problem("there is no plan: go back to the Plan screen")
        if problem:
            return problem
        missing = self.state.files_problem()        # planned without it; the files need it (main_process_ip)
        if missing is None:
            return None
        from wizard.frontends.session import question_for_field
        f = self.field(question_for_field(missing.field) or "")
        if f is not None and f.display:
            f.set_error(str(missing))
            f.control.focus()
        return str(missing)

    def result_pending(self) -> str | None:
        return self.sizing_busy()

    def busy(self) -> str | None:
        return self.sizing_busy()
