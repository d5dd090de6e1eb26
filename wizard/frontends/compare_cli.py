"""`wizard compare`: the machines side by side (wizard.compare), as a table or JSON; `--write MACHINE` writes one
row's files through `wizard --non-interactive --assume MACHINE`'s own code (non_interactive.cmd_non_interactive).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from wizard import compare as compare_mod
from wizard.config import sky_task
from wizard.frontends.flags import UNDERSCORES, add_calibration_flag, add_question_flags, given, refuse_empty_values
from wizard.units import fmt_duration

DESCRIPTION = (
    "Which machine to rent: the plan for each machine side by side, with its speed, the time to train "
    "--train-tokens (or --dataset-tokens x --epochs; else per 1B tokens) and the cost at your prices per GPU-hour. "
    "Writes nothing, unless --write MACHINE.")

EPILOG = (
    "Each row is `wizard plan --assume MACHINE` with the same options. Without --machines: "
    "1, 2, 4 and 8 of each data-centre GPU class of the catalogue and of the PCIe cards GPU clouds rent (H100 PCIe, "
    "L40S, A10G, L4, RTX 4090), and 2 x 8 of the NVLink class with the most memory (--max-gpus bounds it). Prices "
    "are yours (the wizard ships none): --price 8xA100-80GB=1.8,H100-80GB=2.5 or "
    "--prices FILE, a YAML file with `date: YYYY-MM-DD` and `prices: {MACHINE or GPU: per GPU-hour}` (a date more "
    f"than {compare_mod.STALE_PRICE_DAYS} days old is warned about, one after today refused), or --prices skypilot "
    "(or skypilot-spot): the cheapest offer in the price catalogues SkyPilot has downloaded (~/.sky/catalogs). "
    "Every row trains one global batch (--global-batch, else micro-batch x accumulation x the least common multiple "
    "of the GPU counts). --write MACHINE -- SCRIPT ARGS also writes a SkyPilot task (sky.yaml) that rents MACHINE and "
    "runs `wizard launch` there: `sky launch -c NAME D/sky.yaml`. Exit codes: 0 done, 2 bad input, 3 nothing fits "
    "on any machine.")


def build_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = DESCRIPTION
    p.epilog = EPILOG + " " + UNDERSCORES
    g = p.add_argument_group("machines and prices")
    g.add_argument("--machines", metavar="LIST", default=None,
                   help="machines to compare, e.g. 8xA100-80GB,4xH100-80GB,1xH200,2x8xH100-80GB "
                        "(default: the catalogue's data-centre classes)")
    g.add_argument("--max-gpus", metavar="N", default=None,
                   help="leave out the default machines with more than N GPUs in all")
    g.add_argument("--price", metavar="LIST", default=None,
                   help="price per GPU-hour by machine or GPU, e.g. 8xA100-80GB=1.8,H100-80GB=2.5")
    g.add_argument("--prices", metavar="FILE", default=None,
                   help="YAML prices file with a `date:`, or skypilot / skypilot-spot for SkyPilot's downloaded "
                        "catalogues (--price entries win over it)")
    g.add_argument("--sort", metavar="time|cost", default="time", help="order of the rows")
    io = p.add_argument_group("input and output")
    io.add_argument("--answers", metavar="FILE", default=argparse.SUPPRESS,
                    help="YAML/JSON answers keyed by question id (flags win over the file)")
    io.add_argument("--json", action="store_true", default=False, help="print the comparison as JSON")
    io.add_argument("--write", metavar="MACHINE", default=None,
                    help="write that machine's files, as `wizard --non-interactive --assume MACHINE` does")
    io.add_argument("--output-dir", metavar="D", default=argparse.SUPPRESS,
                    help="with --write: where the files go (default: accelerate's config dir)")
    io.add_argument("--dry-run", action="store_true", default=argparse.SUPPRESS, help="with --write: write nothing")
    io.add_argument("--sky-task", metavar="NAME", default=None,
                    help=f"with --write MACHINE -- SCRIPT: the SkyPilot task's file name in the output dir "
                         f"(default: {sky_task.TASK_NAME})")
    io.add_argument("command", nargs=argparse.REMAINDER,
                    help="with --write: -- SCRIPT [ARGS...] also writes a SkyPilot task that runs it on MACHINE")
    add_question_flags(p)
    add_calibration_flag(p, help="plan every machine by the raw model, without the ratios `wizard tune` measured")
    p.set_defaults(func=cmd_compare)
    return p


def cmd_compare(ns: argparse.Namespace) -> int:
    from wizard.config.answers import values_from_namespace
    from wizard.errors import EXIT_NOTHING_FITS, InputError
    refuse_empty_values(ns)
    if ns.sort not in compare_mod.SORTS:
        raise InputError("sort", f"{ns.sort!r} is not a sort order", "|".join(compare_mod.SORTS))
    machines, prices = compared_machines(ns)
    if ns.write is not None:
        return write_machine(ns, machines)
    if getattr(ns, "output_dir", None) is not None or getattr(ns, "dry_run", False):
        raise InputError("output-dir", "--output-dir and --dry-run go with --write MACHINE (compare writes nothing)",
                         "--write MACHINE --output-dir D")
    if script_command(ns) or ns.sky_task is not None:
        raise InputError("write", "-- SCRIPT and --sky-task go with --write MACHINE (the task runs that machine's "
                         "files)", "--write MACHINE --output-dir D -- SCRIPT [ARGS...]")
    flags = {**values_from_namespace(ns), **batch_flag(ns, machines)}
    answers_file = getattr(ns, "answers", None)

    def command(m: compare_mod.Machine) -> str:
        return compare_mod.write_command(m, flags, answers_file)

    result = compare_mod.compare(given(ns), machines, prices, sort=ns.sort, calibrate=not ns.no_calibration,
                                 command_for=command)
    if ns.json:
        print(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        print_comparison(result, address_given=flags.get("main_process_ip") is not None)
    for w in result.warnings:
        print(f"wizard: warning: {w}", file=sys.stderr)
    return 0 if any(r.fits for r in result.rows) else EXIT_NOTHING_FITS


def compared_machines(ns: argparse.Namespace) -> tuple[list[compare_mod.Machine], compare_mod.Prices]:
    """The machines and prices the comparison flags name, checked the same with or without --write (the table's
    footer tells the user to add --write MACHINE to the command that printed it)."""
    from wizard.errors import InputError
    max_gpus = compare_mod.check_max_gpus(ns.max_gpus)
    if ns.machines is not None:
        if max_gpus is not None:
            raise InputError("max-gpus", "bounds the default machines; --machines names them itself",
                             "--machines LIST or --max-gpus N, not both")
        machines = compare_mod.parse_machines(ns.machines)
    else:
        machines = compare_mod.default_machines(max_gpus)
    return machines, compare_mod.prices_from(ns.price, ns.prices)


def write_machine(ns: argparse.Namespace, compared: list[compare_mod.Machine]) -> int:
    """`--write MACHINE`: `wizard --non-interactive --assume MACHINE` with the same options, through its code. With
    --machines the machine is one of them; prices and the sort change no file."""
    from wizard.errors import InputError
    from wizard.frontends.non_interactive import cmd_non_interactive
    compare_mod.refuse_machine_answers(given(ns))
    chosen = compare_mod.machine(ns.write) if ns.write.strip() else None
    if chosen is None:
        raise InputError("write", "is empty", compare_mod.MACHINE_FORMAT)
    if ns.machines is not None and chosen.key not in {m.key for m in compared}:
        raise InputError("write", f"{ns.write} is not one of --machines ({', '.join(m.label for m in compared)})",
                         "a machine of --machines, or --write without --machines")
    for qid, value in batch_flag(ns, compared).items():
        setattr(ns, qid, str(value))       # the global batch the comparison's rows train, as the flag gives it
    from wizard.frontends import sky_write
    task = sky_write.prepare(ns, chosen, script_command(ns)) if script_command(ns) else None
    if task is None and ns.sky_task is not None:
        raise InputError("sky-task", "names the SkyPilot task that -- SCRIPT [ARGS...] makes",
                         "--write MACHINE --sky-task NAME -- SCRIPT [ARGS...]")
    ns.assume, ns.hardware = chosen.assume, None
    code = cmd_non_interactive(ns)
    if code == 0 and task is not None:
        sky_write.write(ns, task)
    return code


def script_command(ns: argparse.Namespace) -> list[str]:
    """-- SCRIPT [ARGS...] after compare's own flags (argparse's REMAINDER keeps the "--")."""
    words = list(getattr(ns, "command", None) or [])
    return words[1:] if words[:1] == ["--"] else words


def batch_flag(ns: argparse.Namespace, machines: list[compare_mod.Machine]) -> dict[str, int]:
    """{"global_batch": N} when the comparison chose the global batch (the user gave none): the rows' write
    commands and --write plan with it, so the files are the row's."""
    batch, from_user = compare_mod.equal_global_batch(given(ns), machines)
    return {} if from_user or batch is None else {"global_batch": batch}


# ----------------------------------------------------------------------------- the table

COLUMNS = ("", "machine", "plan", "micro x acc", "GC", "GPU mem", "host RAM", "tokens/s", "step", "time", "cost")
RIGHT = {5, 6, 7, 8, 9, 10}


def _gib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.0f}"


def memory_cells(r: compare_mod.Row) -> tuple[str, str]:
    """GPU memory the row's rung needs / each GPU has (GiB), and the host RAM per machine the plan assumed."""
    from wizard.units import fmt_bytes
    gpu = f"{_gib(r.per_gpu_bytes)}/{_gib(r.gpu_memory_bytes)} GiB" if r.gpu_memory_bytes else "-"
    return gpu, fmt_bytes(r.host_ram_bytes) if r.host_ram_bytes else "-"


def row_cells(r: compare_mod.Row, currency: str = "") -> tuple[str, ...]:
    from wizard.planning.speed import fmt_rate
    mark = ("F" if r.fastest else "") + ("C" if r.cheapest else "")
    if r.error:
        return (mark, r.machine.label, "cannot plan", "", "", "", "", "", "", "", "")
    gpu, host = memory_cells(r)
    if not r.fits:
        by = f" by {(r.short_by - 1) * 100:.0f}%" if r.short_by and r.short_by > 1 else ""
        return (mark, r.machine.label, f"does not fit{by}", "", "", gpu, host, "", "", "", "")
    plan = r.rung + (" (measured)" if r.measured else "")
    return (mark, r.machine.label, plan, f"{r.micro_batch} x {r.grad_accum}",
            "on" if r.gradient_checkpointing else "off", gpu, host,
            fmt_rate(r.tokens_per_second or 0).replace(" tok/s", ""),
            f"{r.step_seconds:.2f}s" if r.step_seconds is not None else "-",
            fmt_duration(r.train_seconds) if r.train_seconds else "-",
            compare_mod.fmt_cost(r.cost, currency))


def table_lines(c: compare_mod.Comparison) -> list[str]:
    cells = [COLUMNS] + [row_cells(r, c.currency) for r in c.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    out = []
    for row in cells:
        parts = [cell.rjust(w) if i in RIGHT else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))]
        out.append("  ".join(parts).rstrip())
    return out


def header_lines(c: compare_mod.Comparison) -> list[str]:
    method = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA"}.get(c.method, c.method)
    tokens = f"{c.train_tokens:,} tokens" if c.tokens_given else \
        f"1B tokens ({compare_mod.DEFAULT_TRAIN_TOKENS:,}; --train-tokens gives the run's)"
    lines = [f"Model: {c.model}, {method}. Time and cost to train {tokens}; sorted by {c.sort}."]
    if c.global_batch:
        why = "--global-batch" if c.global_batch_given else \
            "micro-batch x accumulation x the least common multiple of the machines' GPU counts; --global-batch N"
        lines.append(f"Every machine trains the same global batch: {c.global_batch} sequences per optimizer step "
                     f"({why}). GPU mem: the plan's need / each GPU's; host RAM: per machine, as assumed "
                     "(--machines ...,ram=SIZE sets it).")
    return lines + [compare_mod.CAVEAT]


def print_comparison(c: compare_mod.Comparison, file: TextIO | None = None, address_given: bool = False) -> None:
    out = file or sys.stdout
    for line in header_lines(c):
        print(line, file=out)
    print("", file=out)
    for line in table_lines(c):
        print(line, file=out)
    print("", file=out)
    legend = []
    if c.fastest:
        legend.append(f"F fastest: {c.fastest.machine.label}")
    if c.cheapest:
        legend.append(f"C cheapest: {c.cheapest.machine.label}")
    elif not any(r.price_per_gpu_hour is not None for r in c.rows):
        legend.append("no cost without prices (--price MACHINE=PRICE per GPU-hour, or --prices FILE)")
    if legend:
        print("; ".join(legend) + ".", file=out)
    if c.prices_label:
        print(c.prices_label, file=out)
    offers = [r for r in c.rows if r.offer is not None and (r.cheapest or r.fastest)]
    for r in offers:
        o = r.offer
        price = o.spot_price if r.offer_spot else o.price
        print(f"  {r.machine.label}: {o.where()}, {price:.2f} USD per instance-hour"
              f"{' (spot)' if r.offer_spot else ''} x {r.machine.nodes} (catalogue of {o.date.isoformat()})",
              file=out)
    misses = [r for r in c.rows if not r.fits]
    if misses:
        print("Does not fit (the rung closest to fitting):", file=out)
        for r in misses:
            print(f"  {r.machine.label}: {r.error or r.shortfall}", file=out)
    fitting = [r for r in c.rows if r.write_command]
    if fitting:
        several = "" if address_given or all(r.machine.nodes == 1 for r in fitting) else \
            "; with --main-process-ip ADDRESS for a machine of several nodes"
        print(f"Write a machine's files (or add --write MACHINE to this command{several}):", file=out)
        for r in fitting:
            print(f"  {r.machine.label}: {r.write_command}", file=out)
