"""The flags several commands share, and what they mean: the question flags (from the question table), input and
output, the hardware override, the calibration switch, and the Request they make. One home that `cli` (the wizard,
`plan`, `tune`) and `compare_cli` both import.

Light: argparse only at import; the question table and the pipeline are imported when a parser is built.
"""

from __future__ import annotations

import argparse
from typing import Any

from wizard.errors import InputError

UNDERSCORES = "Every flag also takes accelerate's underscore spelling (--num_processes = --num-processes)."


def add_question_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per question of the table, in its group, with its default in the help."""
    from wizard.config.answers import cli_arguments
    groups: dict[str, Any] = {}
    for flag, kwargs in cli_arguments():
        title = kwargs.pop("group", None) or "options"
        group = groups.get(title) or parser.add_argument_group(title)
        groups[title] = group
        kwargs["help"] = f"{kwargs['help']} (default: {help_default(kwargs['dest'])})"
        group.add_argument(flag, default=argparse.SUPPRESS, **kwargs)


def help_default(qid: str) -> str:
    """The default a question's flag has, as --help shows it: the value where it is fixed, else what
    it is computed from (the plan's and the hardware's defaults are shown by `wizard plan`)."""
    from wizard.config.questions import Context, by_id
    from wizard.frontends.session import format_value
    q = by_id(qid)
    if q.help_default:
        return q.help_default
    if not q.fixed_default:
        return "from the hardware and the plan"
    value = q.default(Context(hardware=None))
    if value is None:
        return "unset"
    return format_value(q, value).replace("%", "%%")


def add_common_flags(parser: argparse.ArgumentParser, *, json_help: str) -> None:
    g = parser.add_argument_group("input and output")
    g.add_argument("--answers", metavar="FILE", default=argparse.SUPPRESS,
                   help="YAML/JSON answers keyed by question id (flags win over the file)")
    add_hardware_flags(g)
    g.add_argument("--output-dir", metavar="D", default=argparse.SUPPRESS,
                   help="where default_config.yaml and ds_config.json go (default: accelerate's config dir)")
    g.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS, help="write nothing")
    g.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=json_help)


def add_hardware_flags(g) -> None:
    g.add_argument("--hardware", metavar="FILE", default=argparse.SUPPRESS,
                   help="replay a saved `wizard probe --json` instead of probing this machine")
    g.add_argument("--assume", metavar="SPEC", default=argparse.SUPPRESS,
                   help="plan for another machine, e.g. 8xH100-80GB, 4xA100-40GB,ram=512G, 2xRTX4090")


def add_calibration_flag(p: argparse.ArgumentParser,
                         help: str = "show the raw model, without the ratios `wizard tune` measured on this "
                                     "machine") -> None:
    p.add_argument("--no-calibration", action="store_true", default=False, help=help)


def given(ns: argparse.Namespace) -> dict[str, Any]:
    """Question answers: the answers file first, flags over it."""
    from wizard.config.answers import load_answers_file, merge_given, values_from_namespace
    from_file = load_answers_file(ns.answers) if getattr(ns, "answers", None) else {}
    return merge_given(values_from_namespace(ns), from_file)


NOT_EMPTY = {"answers": "a YAML or JSON answers file", "hardware": "a file written by `wizard probe --json`",
             "assume": "a machine such as 8xH100-80GB", "output_dir": "a directory (omit the flag for the default)"}


def refuse_empty_values(ns: argparse.Namespace) -> None:
    """`--assume ""` must not quietly probe this machine, nor `--output-dir ""` write to the default dir."""
    for dest, allowed in NOT_EMPTY.items():
        value = getattr(ns, dest, None)
        if value is not None and not str(value).strip():
            raise InputError(dest.replace("_", "-"), "is empty", allowed)


def request(ns: argparse.Namespace):
    """The pipeline's Request for these flags."""
    from wizard.pipeline import Request
    refuse_empty_values(ns)
    return Request(given=given(ns), hardware_file=getattr(ns, "hardware", None), assume=getattr(ns, "assume", None),
                   output_dir=getattr(ns, "output_dir", None), dry_run=bool(getattr(ns, "dry_run", False)),
                   calibrate=not getattr(ns, "no_calibration", False),
                   ds_config_ref=getattr(ns, "ds_config_ref", None))
