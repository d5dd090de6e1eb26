"""`wizard check` command line (also runnable as `python -m wizard.frontends.check_cli`).

Exit codes: 0 no error findings (warnings allowed), 1 error findings, 2 unreadable input (one line).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

DESCRIPTION = (
    "Read the accelerate config, its DeepSpeed JSON and your TrainingArguments, and say before launch what will "
    "go wrong, where, when (launch, prepare, step 0, save) and how to fix it.")

EPILOG = (
    "Defaults: accelerate's default config file ($HF_HOME/accelerate/default_config.yaml or "
    "${XDG_CACHE_HOME:-~/.cache}/huggingface/accelerate/default_config.yaml), the ds_config.json it names, and "
    "this machine's probe. --trainer says who fills \"auto\": hf (transformers' Trainer, the default) or "
    "accelerate (your own loop with accelerator.prepare, which fills fewer keys). Exit 0: no errors (warnings "
    "allowed); 1: errors found; 2: unreadable input.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-file", metavar="P", help="accelerate config YAML (default: accelerate's default file)")
    p.add_argument("--ds-config", metavar="P", help="DeepSpeed JSON (default: the YAML's deepspeed_config_file)")
    p.add_argument("--training-args", metavar="P",
                   help="JSON or YAML file of the TrainingArguments keyword arguments your script passes")
    p.add_argument("--model", metavar="M", help="model directory, config.json or cached Hub id (for the FSDP wrap "
                   "class and the memory check)")
    hw = p.add_mutually_exclusive_group()
    hw.add_argument("--hardware", metavar="FILE", help="a saved `wizard probe --json` instead of probing")
    hw.add_argument("--assume", metavar="SPEC", help="plan for another machine, e.g. 8xH100-80GB")
    p.add_argument("--trainer", choices=("hf", "trl", "accelerate"), default="hf",
                   help="who fills \"auto\" in the ds_config: hf Trainer (default), trl (a Trainer with SFTConfig's "
                        "defaults) or an own Accelerate loop")
    p.add_argument("--seq-len", type=int, default=2048, metavar="N",
                   help="sequence length for the memory check with --model (default 2048)")
    p.add_argument("--method", default="full", metavar="full|lora|qlora",
                   help="fine-tuning method: lora/qlora also check peft (and bitsandbytes) versions and size the "
                   "memory check with adapters")
    p.add_argument("--lora-rank", default=16, metavar="R", help="LoRA rank for the memory check (default 16)")
    p.add_argument("--lora-targets", default=None, metavar="T",
                   help="LoRA target modules: default (peft's for the model), all-linear, or names")
    p.add_argument("--sky-task", metavar="P", default=None,
                   help="a SkyPilot task `wizard compare --write MACHINE -- SCRIPT` wrote: its nodes, GPUs and launch "
                        "line against the config")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list")
    p.add_argument("--fix", action="store_true",
                   help="rewrite the files for findings with a safe automatic fix (atomic, .bak kept), then re-check")


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("check", help="find config conflicts before a GPU hour is spent",
                              description=DESCRIPTION, epilog=EPILOG)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


def _hardware(args: argparse.Namespace) -> Any:
    from wizard.probe import hardware

    if args.hardware:
        return hardware.load_file(args.hardware)
    if args.assume:
        return hardware.assume(args.assume)
    try:
        return hardware.probe()
    except NotImplementedError:
        return None


def run(args: argparse.Namespace) -> int:
    from wizard.check.doctor import build_context, format_findings, has_errors
    from wizard.check.rules.methods import method_options
    from wizard.errors import InputError, stop_signal

    def context(hw):
        return build_context(config_file=args.config_file, ds_config=args.ds_config,
                             training_args=args.training_args, model=args.model, hardware=hw,
                             trainer=args.trainer, seq_len=args.seq_len,
                             method=method_options(args.method, args.lora_rank, args.lora_targets),
                             sky_task=args.sky_task)

    try:
        with _stdout_to_stderr():
            findings, fixed = _work(args, context)
    except InputError as exc:
        if stop_signal() is None:
            print(f"wizard check: {exc}", file=sys.stderr)
            return exc.exit_code
    if stop_signal() is not None:     # a library's import swallowed a stop signal: the findings may be incomplete
        raise KeyboardInterrupt(f"signal {stop_signal()}")
    # The findings are the installed libraries' verdicts: a version outside the tested range is named first.
    from wizard.frontends.env import note_untested_versions
    note_untested_versions()
    if args.json:
        out: Any = [f.to_json() for f in findings]
        print(json.dumps(out, indent=2))
        if fixed is not None:
            print(_fix_summary(fixed), file=sys.stderr)
    else:
        if fixed is not None:
            print(_fix_summary(fixed))
        print(format_findings(findings))
    return 1 if has_errors(findings) else 0


def _work(args: argparse.Namespace, context):
    from wizard.check.doctor import apply_fixes, run_rules
    from wizard.errors import InputError

    if args.seq_len is not None and args.seq_len < 1:
        raise InputError("seq-len", f"{args.seq_len} must be at least 1", "a positive whole number")
    hw = _hardware(args)
    ctx = context(hw)
    findings = run_rules(ctx)
    fixed = None
    if args.fix:
        fixed = apply_fixes(ctx, findings)
        if fixed.written:
            findings = run_rules(context(hw))
    return findings, fixed


@contextlib.contextmanager
def _stdout_to_stderr():
    """DeepSpeed logs and JIT builds write to stdout (some from C); keep stdout for the findings alone."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _fix_summary(fixed) -> str:
    if not fixed.changes and not fixed.skipped:
        return "--fix: nothing to fix automatically."
    lines = ["--fix changed:"] + [f"  {c}" for c in fixed.changes]
    lines += [f"  wrote {w}" for w in fixed.written] + [f"  kept the previous version as {b}" for b in fixed.backups]
    lines += [f"  not fixed: {s}" for s in fixed.skipped]
    lines.append("Re-check after the fix:")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wizard check", description=DESCRIPTION, epilog=EPILOG)
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
