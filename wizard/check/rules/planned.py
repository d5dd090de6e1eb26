"""The files the wizard is about to write, judged against the plan they were written for: accelerate's
loader and launch checks, DeepSpeed's config models and transformers' "auto" filling, with the plan's
world size, precision, stage and offload (config/validate.py holds the library calls).

One rule of the registry, silent unless the context carries `planned` (the check before a write); the
ids it reports are its own family's (PLAN_FILE_IDS), or a registered rule's id where the library's verdict
is that rule's problem, so one problem keeps one id whichever way it is found.
"""

from __future__ import annotations

from typing import Iterable

from wizard.check.rules.common import CheckContext, rule
from wizard.findings import Finding

PLAN_FILE_IDS = ("ACC-DS-PATH", "ACC-DS-RELATIVE", "ACC-WARNING", "ACC-NUM-PROCESSES", "DS-PLAN-STAGE",
                 "DS-PLAN-OFFLOAD", "DS-CPU-TRAIN-BATCH", "DS-PLAN-PRECISION", "DS-JSON")


@rule("PLAN-FILES", "plan", "the files about to be written, read by the libraries with the plan's settings")
def planned_files(ctx: CheckContext) -> Iterable[Finding]:
    planned = ctx.planned
    if planned is None or ctx.acc_path is None:
        return []
    from wizard.config.validate import library_findings

    ds_path = ctx.ds_path if ctx.ds_from == "--ds-config" else None
    return library_findings(ctx.acc_path, ds_path, planned.answers, planned.plan, planned.model,
                            yaml_display=planned.displays.get(ctx.acc_path),
                            ds_display=planned.displays.get(ds_path) if ds_path else None)
