"""`wizard --non-interactive`: plan, validate and write from the flags alone (flags > --answers FILE > defaults).
`wizard compare --write MACHINE` runs it for one machine of a comparison."""

from __future__ import annotations

import argparse
import json
import os
import sys

from wizard.errors import EXIT_NOTHING_FITS
from wizard.frontends.flags import request


def nothing_fits_exit(result, alternatives_shown: bool = False) -> int:
    """`alternatives_shown`: the text plan printed its `Instead:` lines; the exit line does not repeat them."""
    if result.plan.choice is not None:
        return 0
    from wizard.frontends import report
    print(f"wizard: {report.nothing_fits_message(result, alternatives_shown)}", file=sys.stderr)
    return EXIT_NOTHING_FITS


def cmd_non_interactive(ns: argparse.Namespace) -> int:
    from wizard.frontends import report
    from wizard.pipeline import build, to_json, validate, write
    req = request(ns)
    preload_validation_in_background()
    if not req.dry_run:
        from wizard.fsutil import check_writable_dir
        from wizard.pipeline import default_output_dir
        check_writable_dir(os.path.abspath(os.path.expanduser(req.output_dir or default_output_dir())))
    result = build(req)
    as_json = bool(getattr(ns, "json", False))
    if result.plan.choice is None:
        if as_json:
            print(json.dumps(to_json(result), indent=2, sort_keys=True, default=str))
        else:
            report.print_plan(result)
        return nothing_fits_exit(result, alternatives_shown=not as_json)
    # The files are judged by the installed libraries from here on: a version outside the tested range is
    # named (one line, stderr) before the verdict, whatever it is.
    from wizard.frontends.env import note_untested_versions
    note_untested_versions()
    validate(result)
    if result.errors:
        if as_json:
            print(json.dumps(to_json(result), indent=2, sort_keys=True, default=str))
        report.print_findings(result.findings, file=sys.stderr)
        print("wizard: the generated configuration failed validation; nothing was written", file=sys.stderr)
        return 1
    if not req.dry_run:
        write(result, req.given)
    if as_json:
        doc = to_json(result)
        if req.dry_run:
            doc["files"] = {"accelerate_config": None, "deepspeed_config": None}
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        report.print_plan(result)
        report.print_written(result, dry_run=req.dry_run)
        report.print_adapter_snippet(result)
    return 0


def preload_validation_in_background() -> None:
    """Importing accelerate/DeepSpeed/transformers takes seconds: overlap it with probing and sizing."""
    import threading

    def preload():
        try:
            from wizard.config.validate import preload as load
            load()
        except Exception:  # a library's import can raise anything; validation imports it again and reports it
            pass

    threading.Thread(target=preload, name="wizard-preload", daemon=True).start()
