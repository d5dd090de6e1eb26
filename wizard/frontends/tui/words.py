"""Words for the screens: the planner writes for the command line ("--micro-batch 4"); a screen names the
field the user sees instead. No Textual here: pure text in, text out."""

from __future__ import annotations

import re

from wizard.config.questions import QUESTIONS, RAM_QUESTION, Question

_FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?: ([A-Za-z0-9][A-Za-z0-9+-]*(?:\.\d+)?))?")
_ASSUMED_RAM = re.compile(r"--assume \.\.\.,ram=(\d+)G\b")


def field_name(q: Question) -> str:
    """The question as a screen labels it, without the parenthesised aside: “Micro-batch per device”."""
    return "“" + re.sub(r" \(.*\)$", "", q.prompt) + "”"


def in_words(text: str) -> str:
    """The planner's sentences name command-line flags ("--micro-batch 4", "(--nvme-path)"); on a screen they
    name the field instead, as the user sees it: “Micro-batch per device” = 4, (“NVMe offload directory”).
    A word after the flag is taken as its value only where the question accepts it (a choice or a number)."""
    flags = {q.flag: q for q in QUESTIONS if q.flag}

    def words(m: re.Match) -> str:
        q = flags.get(f"--{m.group(1)}")
        if q is None:
            return m.group(0)
        value = m.group(2)
        if value is not None and _is_value(q, value):
            return f"{field_name(q)} = {value}"
        return field_name(q) + (f" {value}" if value is not None else "")

    text = _ASSUMED_RAM.sub(lambda m: f"{field_name(RAM_QUESTION)} = {m.group(1)}GiB", text)
    return _FLAG.sub(words, text)


def _is_value(q: Question, word: str) -> bool:
    if q.choices is not None:
        return word in q.choices
    if q.kind in ("int", "count", "float", "size"):
        return word[:1].isdigit()
    return False
