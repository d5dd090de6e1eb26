"""One problem found in a configuration, and how it reads: what `wizard check` and the wizard's own check
before a write report (base layer: every stage above may make or show one).

`finding_words` is the one place a finding becomes words; `wizard check`'s columns, the plain report's line
and the TUI's Review screen lay those words out, so a fix to the wording (a library's message that already
ends with its full stop) reaches every front end at once.
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


@dataclass(frozen=True)
class FindingWords:
    severity: str
    rule: str
    file: str
    where: str                    # the key, or "(file)"
    location: str                 # file:key, or the file
    when: str | None
    message: str                  # one sentence, ending with exactly one full stop (or ! / ?)
    fix: str | None
    fixable: bool


def finding_words(f: Finding) -> FindingWords:
    message = f.message.rstrip()
    # A library's own message often ends with its full stop already: never add a second one.
    if not message.endswith((".", "!", "?")):
        message += "."
    location = f.file + (f":{f.key}" if f.key else "")
    return FindingWords(f.severity, f.rule, f.file, f.key or "(file)", location, f.when, message, f.fix, f.fixable)


def finding_line(f: Finding) -> str:
    """One line for a plain report: `error: [RULE] file:key: message Fix: what to do.`"""
    w = finding_words(f)
    return f"{w.severity}: [{w.rule}] {w.location}: {w.message}" + (f" Fix: {w.fix}" if w.fix else "")


def finding_column_line(f: Finding) -> str:
    """One line of `wizard check`'s table: severity and rule in columns, then where, when, what and the fix."""
    w = finding_words(f)
    when = f" [at {w.when}]" if w.when else ""
    fix = f"  fix: {w.fix}" if w.fix else ""
    auto = " (--fix)" if w.fixable else ""
    return f"  {w.severity:<7} {w.rule:<30} {w.where}{when}: {w.message}{fix}{auto}"
