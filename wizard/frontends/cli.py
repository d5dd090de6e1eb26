"""Command line: `wizard` (TUI), `--plain`, `--non-interactive`, and the probe/plan/compare/check/launch/attach/stop/
runs/tune/env subcommands of DESIGN.md's CLI contract.

Start-up matters: this module imports nothing heavy. Flags for the wizard's questions are generated
from the question table, so the TUI, the plain prompts, the answers file and the flags cannot drift.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from wizard import __version__
from wizard.errors import (EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_NOTHING_FITS, EXIT_WRITTEN_BUT_FAILED,
                           InputError, WizardError, clear_stop, note_stop, stop_signal)
from wizard.frontends.flags import (UNDERSCORES, add_calibration_flag, add_common_flags, add_hardware_flags,
                                    add_question_flags, refuse_empty_values, request)
from wizard.frontends.non_interactive import cmd_non_interactive, nothing_fits_exit

SUBCOMMANDS = ("probe", "plan", "compare", "check", "launch", "attach", "stop", "runs", "tune", "env", "preflight")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless the text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unset = default is None or default is False or default == [] or default == argparse.SUPPRESS
        if "default" in text or unset or not action.option_strings or action.nargs == 0:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input, every
    default is in the help, and every flag takes accelerate's underscore spelling as well
    (`--num_processes 4` = `--num-processes 4`, as `accelerate launch` accepts both)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(EXIT_BAD_INPUT, f"wizard: error: {message} (see `{self.prog} --help`)\n")

    def parse_known_args(self, args=None, namespace=None):  # noqa: D401 - argparse API
        args = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(dashed_spelling(args, self._option_string_actions), namespace)


FLAG_VALUED = ("--batch-flag",)     # options whose value is itself a flag (of the training script)


def dashed_spelling(args: list[str], options: dict[str, argparse.Action]) -> list[str]:
    """`--zero_stage 3` -> `--zero-stage 3` for the options this parser knows, up to `--` or the first
    positional (after it come a training script's own arguments, which are not ours to rename)."""
    out: list[str] = []
    value_next = False
    joined = False
    for i, arg in enumerate(args):
        if joined:
            joined = False
            continue
        if arg == "--":
            return out + args[i:]
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            dashed = name.replace("_", "-")
            if name not in options and dashed in options:
                name = dashed
            if name in FLAG_VALUED and name in options and not eq and i + 1 < len(args) and args[i + 1] != "--":
                # its value is the script's flag (`--batch-flag --batch-size`): argparse would take it for ours
                out.append(f"{name}={args[i + 1]}")
                joined = True
                continue
            out.append(name + eq + value)
            action = options.get(name)
            value_next = action is not None and not eq and action.nargs != 0
            continue
        if value_next or arg.startswith("-"):
            out.append(arg)
            value_next = False
            continue
        return out + args[i:]         # a positional: the rest is not ours
    return out


NON_INTERACTIVE_DESCRIPTION = (
    "wizard --non-interactive: never prompts. Every answer comes from the flags, then --answers FILE, then the "
    "recommended default shown after each flag; the files are validated by accelerate, DeepSpeed and "
    "transformers, then written (atomically, the previous file kept as .bak) unless --dry-run.")

NON_INTERACTIVE_EPILOG = (
    "required: a model, --model ID_OR_PATH (a local directory or config.json, or a Hub id in the local cache) "
    "or --params 7B; --nvme-path with --offload nvme; --main-process-ip with --num-machines > 1 (outside SLURM). "
    "defaulted: everything else; '(default: from the hardware and the plan)' means the probe (or --assume / "
    "--hardware) and the plan decide it: backend, ZeRO stage and offload walk the memory ladder, the process "
    "count is one per GPU, precision is bf16 where every GPU has it. `wizard plan` with the same flags shows "
    "the choice and writes nothing. Exit codes: 0 written, 2 bad input (nothing written), 3 nothing fits, "
    "4 written but the result could not be printed (the message names the files), 130 interrupted. "
    + UNDERSCORES)


def build_parser(non_interactive: bool = False) -> argparse.ArgumentParser:
    if non_interactive:
        p = _Parser(prog="wizard --non-interactive", description=NON_INTERACTIVE_DESCRIPTION,
                    epilog=NON_INTERACTIVE_EPILOG)
    else:
        p = _Parser(prog="wizard", description=(
            "Plan, configure, launch and watch multi-GPU Hugging Face training. Without a subcommand: the "
            "interactive wizard (a full-screen TUI; --plain for inline prompts; --non-interactive for scripts)."),
            epilog="subcommands: probe, plan, compare, check, launch, attach, stop, runs, tune, env, preflight (wizard SUBCOMMAND --help). "
                   + UNDERSCORES)
    p.add_argument("--version", action="version", version=f"wizard {__version__}")
    mode = p.add_argument_group("mode")
    mode.add_argument("--non-interactive", action="store_true", default=False,
                      help="never prompt: flags > --answers FILE > recommended defaults")
    mode.add_argument("--plain", action="store_true", default=False,
                      help="ask the questions inline (no full-screen app); also used when TERM=dumb")
    mode.add_argument("--yes", "-y", action="store_true", default=False,
                      help="--plain: write the files without asking \"Write these files?\" at the end (the "
                           "questions still need a terminal; a script gives its answers with --non-interactive "
                           "--answers FILE)")
    add_common_flags(p, json_help="print the machine-readable result")
    add_question_flags(p)
    return p


def build_subparser(name: str) -> argparse.ArgumentParser:
    if name in ("check", "launch", "attach", "stop", "runs"):
        return _registered_subparser(name)
    if name == "preflight":
        from wizard.frontends.preflight_cli import build_parser as build_preflight_parser
        return build_preflight_parser(_Parser)
    if name == "env":
        from wizard.frontends.env import build_parser as build_env_parser
        return build_env_parser(_Parser)
    p = _Parser(prog=f"wizard {name}")
    if name == "probe":
        p.description = "What this machine has: GPUs (NVML), interconnect, CPU, RAM, disk, library versions."
        g = p.add_argument_group("input and output")
        add_hardware_flags(g)
        g.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        g.add_argument("--output-dir", metavar="D", default=argparse.SUPPRESS,
                       help="directory whose free disk is reported (default: accelerate's config dir)")
        g.add_argument("--nvme-path", metavar="P", default=argparse.SUPPRESS,
                       help="candidate NVMe offload path whose free disk is reported")
        p.set_defaults(func=cmd_probe)
        return p
    if name == "plan":
        p.description = "The memory ladder and the choice, with every rung's per-GPU arithmetic. Writes nothing."
        p.epilog = UNDERSCORES
        add_common_flags(p, json_help="print the machine-readable plan")
        add_question_flags(p)
        add_calibration_flag(p)
        p.set_defaults(func=cmd_plan)
        return p
    if name == "tune":
        return build_tune_parser(p)
    if name == "compare":
        from wizard.frontends.compare_cli import build_parser as build_compare_parser
        return build_compare_parser(p)
    raise ValueError(name)


def build_tune_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    from wizard import tune
    p.description = ("wizard tune [OPTIONS] -- SCRIPT [ARGS...]: run the plan's best candidates with your own script "
                     "for a few optimizer steps each (bounded trials under the launch supervisor), show predicted "
                     "against measured, write the measured winner and calibrate later plans on this machine.")
    p.epilog = UNDERSCORES
    add_common_flags(p, json_help="print the whole table as JSON")
    add_question_flags(p)
    add_calibration_flag(p, help="pick the candidates by the raw model, without this machine's earlier ratios, "
                                  "and record none from these trials")
    g = p.add_argument_group("trials")
    g.add_argument("--steps", type=int, default=tune.DEFAULT_STEPS, metavar="N",
                   help="measured optimizer steps per candidate; the script must run at least --warmup-steps + "
                        "--steps + 1 optimizer steps (a step is timed up to the start of the next)")
    g.add_argument("--warmup-steps", type=int, default=tune.DEFAULT_WARMUP, metavar="N",
                   help="optimizer steps run before measuring")
    g.add_argument("--candidates", type=int, default=tune.DEFAULT_CANDIDATES, metavar="N",
                   help="at most N rungs of the plan")
    g.add_argument("--budget", type=float, default=tune.DEFAULT_BUDGET_S, metavar="S",
                   help="seconds for all trials together")
    g.add_argument("--trial-timeout", type=float, default=tune.DEFAULT_TRIAL_TIMEOUT_S, metavar="S",
                   help="seconds for one trial")
    g.add_argument("--variants", type=int, default=tune.DEFAULT_VARIANTS, metavar="N",
                   help="at most N micro-batch variants of the best candidate (largest micro-batch without and with "
                        "gradient checkpointing, the fastest split of the global batch); 0: none")
    g.add_argument("--max-micro-batch", type=int, default=None, metavar="N",
                   help="the largest-micro-batch variants at most N (default: the largest that fits; on CPU processes "
                        f"{tune.CPU_MICRO_BATCH_FACTOR}x the plan's)")
    g.add_argument("--allow-global-batch-change", action="store_true", default=False,
                   help="a micro-batch variant that trains another global batch than yours may win (it changes the "
                        "training: learning rate and steps may need changing); by default it is measured, not written")
    g.add_argument("--batch-flag", default=None, metavar="FLAG",
                   help="for a script without HF TrainingArguments: its micro-batch flag (e.g. --batch-size), "
                        "appended with the variant's micro-batch")
    g.add_argument("--runs-root", default=None, metavar="D", help="where the trials' run directories go "
                   "(default: ./wizard-runs)")
    g.add_argument("--headless", action="store_true", default=False, help="plain progress lines (the default)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    p.set_defaults(func=cmd_tune)
    return p


def _registered_subparser(name: str) -> argparse.ArgumentParser:
    """check/launch/attach/stop own their flags; they register on a parser whose prog is `wizard`."""
    sub = _Parser(prog="wizard").add_subparsers(dest="command")
    if name == "check":
        from wizard.frontends.check_cli import register
        register(sub)
    else:
        from launch.commands import register
        from wizard.frontends.preflight_cli import launch_preflight
        register(sub, config_findings=launch_config_findings, preflight=launch_preflight)
    return sub.choices[name]


# The warnings `wizard launch` shows before it starts: the config against this machine (a GPU config where there is
# no GPU runs every process on the CPU, for minutes before anything shows).
LAUNCH_WARNINGS = ("ACC-NUM-PROCESSES-EXCEEDS-GPUS",)


def launch_config_findings(path: str, here: bool = True) -> list:
    """What `wizard launch` checks before accelerate starts: `wizard check` on the config alone and, when it runs
    `here`, against this machine's probe (as `wizard preflight` checks each node). Its errors and the
    LAUNCH_WARNINGS."""
    from wizard.check.doctor import run_check
    hw = None
    if here:
        from wizard.probe import hardware
        try:
            hw = hardware.probe()
        except Exception:  # noqa: BLE001 - a probe that fails checks the files alone, as before
            hw = None
    findings = run_check(config_file=path, use_default_config=False, hardware=hw)
    return [f for f in findings if f.severity == "error" or f.rule in LAUNCH_WARNINGS]


# ----------------------------------------------------------------------------- commands

def cmd_probe(ns: argparse.Namespace) -> int:
    from wizard.probe import hardware
    refuse_empty_values(ns)
    from wizard.pipeline import default_output_dir, load_hardware
    hw = load_hardware(getattr(ns, "hardware", None), getattr(ns, "assume", None),
                       getattr(ns, "output_dir", None) or default_output_dir(), getattr(ns, "nvme_path", None))
    if getattr(ns, "json", False):
        print(json.dumps(hw.to_json(), indent=2, sort_keys=True))
        return 0
    for line in hardware.describe(hw):
        print(line)
    for line in hardware.warnings(hw):
        print(f"warning: {line}")
    return 0


def cmd_plan(ns: argparse.Namespace) -> int:
    from dataclasses import replace

    from wizard.frontends import report
    from wizard.pipeline import build
    req = replace(request(ns), plan_only=True)
    result = build(req)
    if getattr(ns, "json", False):
        from wizard.pipeline import to_json
        doc = to_json(result)
        doc["files"] = {"accelerate_config": None, "deepspeed_config": None}
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        report.print_plan(result)
        report.print_script_settings(result)
    return nothing_fits_exit(result, alternatives_shown=not getattr(ns, "json", False))


def cmd_tune(ns: argparse.Namespace) -> int:
    from wizard import tune
    from wizard.frontends import report
    command = list(ns.command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise InputError("SCRIPT", "no training script given", "wizard tune [OPTIONS] -- SCRIPT [ARGS...]")
    beside = script_answers_file(command[0])
    if beside and not (getattr(ns, "answers", None) or getattr(ns, "model", None) or getattr(ns, "params", None)):
        ns.answers = beside      # the script's own answers (its model, its processes): tune needs a model like plan
        print(f"wizard: answers from {beside} (beside the script)", file=sys.stderr)
    req = request(ns)
    if not req.dry_run:
        from wizard.fsutil import check_writable_dir
        from wizard.pipeline import default_output_dir
        check_writable_dir(os.path.abspath(os.path.expanduser(req.output_dir or default_output_dir())))
    opts = tune.TuneOptions(script=command[0], script_args=command[1:], warmup=ns.warmup_steps, steps=ns.steps,
                            candidates=ns.candidates, budget_s=ns.budget, trial_timeout_s=ns.trial_timeout,
                            variants=ns.variants, max_micro_batch=ns.max_micro_batch, batch_flag=ns.batch_flag,
                            allow_batch_change=ns.allow_global_batch_change,
                            runs_root=ns.runs_root, calibrate=not ns.no_calibration)
    as_json = bool(getattr(ns, "json", False))
    progress = (lambda e: None) if as_json else report.tune_progress_printer(sys.stderr)
    result = tune.tune(req, opts, progress=progress)
    if as_json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True, default=str))
    else:
        # the script measured is the one to launch, with the winner's --batch-flag where it took one
        report.print_tune(result, script=command[:1] + (result.script_args if result.script_args is not None
                                                         else command[1:]))
    if not result.trials:
        print("wizard: nothing fits on this hardware: nothing to measure (see `wizard plan`)", file=sys.stderr)
        return EXIT_NOTHING_FITS
    return 0 if result.winner is not None else 1


def script_answers_file(script: str) -> str | None:
    """SCRIPT.answers.yaml (or .json) beside a training script, when there is one: what `wizard tune -- SCRIPT`
    reads when no model is given, as a script ships the answers that describe it (examples/train.answers.yaml)."""
    base = os.path.splitext(script)[0]
    for candidate in (base + ".answers.yaml", base + ".answers.json"):
        if os.path.isfile(candidate):
            return candidate
    return None


def cmd_interactive(ns: argparse.Namespace) -> int:
    plain = ns.plain or os.environ.get("TERM") == "dumb"
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        # Answers piped to --plain would be taken by position, and which questions come depends on the earlier
        # answers and the plan: a script's answer would land on another question without a word. A script
        # names its answers instead (the same question table, the same defaults).
        print("wizard: no terminal here (stdin/stdout is not a TTY) to ask the questions on; a script gives its "
              "answers by name: `wizard --non-interactive --answers FILE` (or the same options as flags); "
              "over SSH, connect with `ssh -t`", file=sys.stderr)
        return EXIT_BAD_INPUT
    req = request(ns)
    if plain:
        from wizard.frontends.prompts import run_plain
        return run_plain(req, yes=bool(getattr(ns, "yes", False)))
    from wizard.frontends.tui import run_tui
    return run_tui(req)


_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
# Commands that own processes and say themselves how a stop ended (the training's code, 130 after a stop):
# a recorded stop signal does not override what they return.
_OWN_EXIT_CODES = ("launch", "attach", "stop")


_ending: list[bool] = []        # non-empty once the command has returned or raised: a signal is then only recorded


def _interrupt(signum, frame):
    note_stop(signum)
    if _ending:
        return
    caller = frame_outside_finalisers(frame)
    if caller is not frame:
        # An exception raised in a __del__ is printed ("Exception ignored in: <function SetBase.__del__>", the
        # regex package's, run by the garbage collector while a library loads) and dropped, and the command
        # would go on: raise it in the frame the finaliser interrupted instead, as that frame goes on.
        raise_when_it_goes_on(caller, KeyboardInterrupt(f"signal {signum}"))
        return
    raise KeyboardInterrupt(f"signal {signum}")


def frame_outside_finalisers(frame):
    """`frame` itself, or, when it runs inside an object's __del__ (anywhere up its stack), where Python ignores
    whatever is raised, the frame the outermost such finaliser interrupted (None: no Python frame). Weakref
    callbacks are finalisers too but look like any function: they are not told apart."""
    outside, f = frame, frame
    while f is not None:
        if f.f_code.co_name == "__del__":
            outside = f.f_back
        f = f.f_back
    return outside


def raise_when_it_goes_on(frame, exc: BaseException) -> None:
    """Raise `exc` in `frame` at its next line (or in its caller's, should it return first), through a trace
    function set for that moment only; the thread's own trace function (a debugger's, coverage's) is put back."""
    if frame is None or _raise_pending:
        return                              # a second Ctrl-C before the first is raised: that one will do
    previous_global, previous_local = sys.gettrace(), frame.f_trace

    def restore() -> None:
        sys.settrace(previous_global)
        target.f_trace = previous_local
        _raise_pending.clear()

    def local(f, event, arg):
        nonlocal target, previous_local
        if event == "return" and f.f_back is not None:
            restore()
            _raise_pending.append(True)
            target, previous_local = f.f_back, f.f_back.f_trace
            sys.settrace(lambda *a: None)
            target.f_trace, target.f_trace_lines = local, True
            return None
        if event in ("line", "opcode", "exception"):
            restore()
            raise exc
        return local

    target = frame
    _raise_pending.append(True)
    sys.settrace(lambda *a: None)          # local trace functions run only while a global one is set
    frame.f_trace, frame.f_trace_lines = local, True


_raise_pending: list[bool] = []           # non-empty while raise_when_it_goes_on waits for its frame


def _record_only(signum, frame):
    note_stop(signum)


def _set_stop_handlers(handler) -> dict:
    """SIGINT, SIGTERM and SIGHUP to `handler`; the handlers they had. Only the main thread may set them."""
    import signal
    import threading
    previous: dict = {}
    if threading.current_thread() is not threading.main_thread():
        return previous
    for name in _STOP_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            previous[sig] = signal.signal(sig, handler)
    return previous


def _install_stop_signals() -> dict:
    """SIGTERM and SIGHUP end the wizard like Ctrl-C: whatever is being written rolls back, exit 130. Each is
    recorded first (errors.note_stop), so that the exit says "interrupted" whatever a library made of it."""
    return _set_stop_handlers(_interrupt)


def _exit_with_on_signals(code: int) -> None:
    """The command has ended and said so: a stop signal from here on ends the process with that same code.

    Python runs these handlers through the atexit hooks; after them it resets every handler it set to
    the default (a signal would then kill the process: -15, -1, -2), so the last atexit hook makes the
    stop signals ignored for what remains (flushing the streams, freeing modules): Python keeps an
    "ignore", and unlike a blocked mask it holds for every thread of the process.
    """
    import atexit
    import signal

    def leave(signum, frame):
        _flush_quietly()
        os._exit(code)

    _set_stop_handlers(leave)
    # atexit runs the newest hook first: registered now, after every library's, this one runs last.
    atexit.register(_set_stop_handlers, signal.SIG_IGN)


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _error_line(exc: BaseException) -> str:
    """One line for an error the commands did not turn into InputError: what, where, why."""
    from wizard.fsutil import one_line, quote_path
    if isinstance(exc, OSError):
        where = f" {quote_path(exc.filename)}" if exc.filename else ""
        if exc.filename2:
            where += f" -> {quote_path(exc.filename2)}"
        if not where:
            return one_line(f"writing the output failed: {exc.strerror or exc}")
        return one_line(f"cannot use{where}: {exc.strerror or exc}")
    if isinstance(exc, RecursionError):
        return "input nests too deeply to be read"
    return one_line(f"{type(exc).__name__}: {exc}")


def _quiet_optional_libraries() -> None:
    """bitsandbytes' CPU backend logs a warning about optional kernels when transformers or peft import it on a
    machine without a GPU; the wizard runs no kernel, and its stderr is one line per problem."""
    import logging
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    from launch._quiet import quiet_library_noise     # kernels' offline "Skipping publisher trust check" (ours)
    quiet_library_noise()


def main(argv: Sequence[str] | None = None) -> int:
    as_program = argv is None
    args = list(sys.argv[1:] if argv is None else argv)
    _quiet_optional_libraries()
    clear_stop()
    _forget_written()
    _forget_version_note()
    previous = _install_stop_signals()
    encoding_errors = _print_any_string()
    code: int | None = None
    _ending.clear()
    _raise_pending.clear()
    try:
        try:
            code, error = _main(args), None
            sys.stdout.flush()    # a full or closed stdout fails here, inside the handlers, not at exit
            _ending.append(True)  # last in the try: a signal before it raises here, after it is recorded
        except (Exception, KeyboardInterrupt) as e:
            _ending.append(True)
            error = e
        finally:
            # From here on a stop signal is only recorded: the outcome reads the record, and a
            # KeyboardInterrupt while its line is printed would end in a traceback.
            _set_stop_handlers(_record_only)
        code = _outcome(code if code is not None else EXIT_BAD_INPUT, error, args[0] if args else "")
        return code
    finally:
        if as_program:
            exiting = sys.exc_info()[1]
            if isinstance(exiting, SystemExit):          # argparse: --help, --version, a usage error
                code = exiting.code if isinstance(exiting.code, int) else (0 if exiting.code is None else 1)
            _exit_with_on_signals(code if code is not None else 1)
        else:                     # called in-process (tests): leave no trace for the caller
            import signal
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            clear_stop()
            _restore_encoding_errors(encoding_errors)


_PRINTS_ANY_STRING = ("backslashreplace", "replace", "namereplace", "xmlcharrefreplace", "ignore")


def _print_any_string() -> dict:
    """Make stdout and stderr print any str: what the wizard prints quotes its inputs (a key, a value, a host
    name), and a lone surrogate from a JSON escape (`"x\\ud800"`) or a character the terminal's encoding lacks
    would otherwise end the command in a UnicodeEncodeError. Such a character is written as its backslash
    escape, which is also valid inside the JSON that --json prints. Returns what to restore."""
    before = {}
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        errors = getattr(stream, "errors", None)
        # strict, or the C locale's surrogateescape (which prints only U+DC80..U+DCFF, the bytes it decoded)
        if errors not in _PRINTS_ANY_STRING and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
                before[name] = (stream, errors or "strict")
            except (ValueError, OSError, AttributeError):   # a detached or closed stream: leave it
                pass
    return before


def _restore_encoding_errors(before: dict) -> None:
    for stream, errors in before.values():
        try:
            stream.reconfigure(errors=errors)
        except (ValueError, OSError, AttributeError):
            pass


def _written() -> list[str]:
    """The config files this command has written (a set write, `check --fix`); fsutil is not imported for it."""
    fsutil = sys.modules.get("wizard.fsutil")
    return fsutil.written_files() if fsutil else []


def _forget_version_note() -> None:
    """A new run may print the out-of-range note again (main() called again in-process, as tests do)."""
    env = sys.modules.get("wizard.frontends.env")
    if env:
        env.forget_note()


def _forget_written() -> None:
    fsutil = sys.modules.get("wizard.fsutil")
    if fsutil:
        fsutil.forget_written()


def _outcome(code: int, error: BaseException | None, command: str) -> int:
    """The exit code and the one `wizard:` line for how the command ended, true to what is on disk.

    0 done; 2 bad input or an OS error, nothing written; 3 nothing fits; 4 files were written and then the
    command failed (printing the result to a full stdout, a rollback that could not finish): the line names
    them; 130 a stop signal, the line saying whether the files were written.
    """
    written = _written()
    on_disk = (f"the files were written ({', '.join(os.path.basename(p) for p in written)} in "
               f"{os.path.dirname(written[0])})" if written else "nothing written")
    fsutil = sys.modules.get("wizard.fsutil")       # not imported: nothing was written
    if fsutil and isinstance(error, fsutil.RollbackFailed):   # also after a signal: the line names the new files
        return _fail(f"cannot write {os.path.dirname(error.new_files[0])}: {error.strerror}", EXIT_WRITTEN_BUT_FAILED)
    stopped = isinstance(error, KeyboardInterrupt) or (stop_signal() is not None and command not in _OWN_EXIT_CODES)
    if stopped and not (error is None and code == EXIT_INTERRUPTED):
        after = written or (fsutil and isinstance(error, fsutil.InterruptedAfterWrite))
        return _fail(f"interrupted; {'the files were written' if after else 'nothing written'}", EXIT_INTERRUPTED)
    if error is None:
        return code
    if isinstance(error, BrokenPipeError):
        _silence_stdout()          # the reader has gone (`| head`): nothing more to say to it
        return 0
    if isinstance(error, WizardError):
        line, failed_code = str(error), error.exit_code
    elif isinstance(error, (OSError, RecursionError)):
        if isinstance(error, OSError) and error.filename is None:
            _silence_stdout()      # stdout itself failed (>/dev/full): say so once, on stderr
            if written:
                return _fail(f"{on_disk}, but printing the result failed: {error.strerror or error}",
                             EXIT_WRITTEN_BUT_FAILED)
        line, failed_code = _error_line(error), EXIT_BAD_INPUT
    else:
        raise error                # a bug: its traceback is what helps
    if written:
        return _fail(f"{line} ({on_disk} before that)", EXIT_WRITTEN_BUT_FAILED)
    return _fail(line, failed_code)


def _fail(message: str, code: int) -> int:
    from wizard.fsutil import one_line
    try:
        print(f"wizard: {one_line(message)}", file=sys.stderr)
    except OSError:
        pass
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's flush at exit does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        parser = build_subparser(argv[0])
        ns = parser.parse_args(argv[1:])
        return int(ns.func(ns) or 0)
    if not argv:
        # Plain `wizard`: nothing to parse, so skip building ~60 flags from the question table
        # (about a tenth of the time to the first screen).
        return cmd_interactive(argparse.Namespace(non_interactive=False, plain=False))
    # `--non-interactive --help` explains what that mode requires and what it defaults.
    ns = build_parser(non_interactive="--non-interactive" in argv).parse_args(argv)
    if ns.non_interactive:
        return cmd_non_interactive(ns)
    return cmd_interactive(ns)


if __name__ == "__main__":
    raise SystemExit(main())
