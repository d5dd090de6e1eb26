"""One problem found in a configuration: what `wizard check` and the wizard's own validation report.

Shared by check/doctor.py (`wizard check`), config/validate.py (the pre-write check), the emitters (which refuse to write a file with an error finding)
and every front end that shows findings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SEVERITIES = ("error", "warning", "info")
WHEN = ("launch", "prepare", "step 0", "save")


@dataclass
class Finding:
    severity: str                 # "error" | "warning" | "info" (said once, never changes the exit code)
    rule: str                     # stable id, e.g. "DS-AUTO-IN-SUBCONFIG"
    file: str                     # the file the problem is in (path as given)
    key: str | None               # dotted key inside the file, None for the file as a whole
    message: str                  # what goes wrong (and when)
    fix: str | None               # what to do about it
    when: str | None = None       # "launch" | "prepare" | "step 0" | "save": when it would bite
    fixable: bool = False         # `wizard check --fix` can repair it safely

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
