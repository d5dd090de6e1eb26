"""The rules of `wizard check`, one module per family.

Each rule is a function `(ctx: CheckContext) -> Iterable[Finding]` registered with `@rule(...)`;
a rule that has a safe automatic repair also registers a fixer with `@fixer(RULE_ID)`.
Importing this package registers every rule (the modules below import `common` and decorate).
"""

from __future__ import annotations

from wizard.check.rules import (  # noqa: F401
    accelerate_yaml,
    deepspeed_json,
    hardware_plan,
    integration,
    libraries,
    machines,
    methods,
    planned,
    sequence_parallel,
    sky_task,
)
from wizard.check.rules.common import FIXERS, RULES, CheckContext, Rule  # noqa: F401
