"""`wizard checkpoint [DIR]`: what a checkpoint directory holds, whether it is complete, and its conversions
(wizard/checkpoint: the libraries' own code). Text or --json; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wizard.errors import InputError
from wizard.units import fmt_bytes, printable

DESCRIPTION = (
    "What a checkpoint holds (DeepSpeed ZeRO stage and world size, FSDP sharded or full, a transformers save, "
    "LoRA adapters; step, dtype, size) and whether it is complete: DIR is one checkpoint or the training's output "
    "directory (its checkpoint-N: a save cut short by a kill is named, and the last complete one found). "
    "--universal converts a DeepSpeed checkpoint to DeepSpeed's universal format (ds_to_universal), which loads on "
    "another world size; --export OUT writes a model from_pretrained loads (DeepSpeed's zero_to_fp32, accelerate's "
    "merge_fsdp_weights, peft's merge_and_unload with --merge-adapter). Both take the last complete checkpoint "
    "of an output directory.")

EPILOG = ("Exit codes: 0 done (an inspection that finds only partial checkpoints also exits 0 and says so), 2 bad "
          "input: not a checkpoint, a partial one to convert, no disk space; nothing is written then. The converters "
          "load the checkpoint as the libraries do (pickle): convert checkpoints you or your training wrote.")


def build_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.description = DESCRIPTION
    p.epilog = EPILOG
    p.add_argument("dir", nargs="?", default=".", metavar="DIR",
                   help="a checkpoint, or an output directory holding checkpoint-N (default: the current directory)")
    p.add_argument("--json", action="store_true", default=False, help="print what was found as JSON")
    g = p.add_argument_group("conversions")
    g.add_argument("--universal", action="store_true", default=False,
                   help="write DeepSpeed's universal checkpoint beside the tag (<tag>_universal, latest_universal)")
    g.add_argument("--export", metavar="OUT", default=None,
                   help="write a safetensors model from_pretrained loads into OUT (a new directory)")
    g.add_argument("--merge-adapter", action="store_true", default=False,
                   help="--export: merge a LoRA adapter into its base model (peft's merge_and_unload)")
    g.add_argument("--base", metavar="MODEL", default=None,
                   help="--merge-adapter: the base model (default: the adapter config's base_model_name_or_path)")
    g.add_argument("--config", metavar="DIR", default=None,
                   help="--export: the directory of the model's config.json when the checkpoint has none "
                        "(an FSDP sharded save)")
    g.add_argument("--workers", type=int, default=1, metavar="N",
                   help="--universal: DeepSpeed's extract workers (processes)")
    p.set_defaults(func=cmd_checkpoint)
    return p


def _row(ck) -> str:
    step = "-" if ck.step is None else str(ck.step)
    state = "complete" if ck.complete else "PARTIAL"
    return f"{printable(ck.name)}  step {step}  {ck.engine}  {ck.dtype or '-'}  {fmt_bytes(ck.bytes)}  {state}"


def describe(ck) -> list[str]:
    out = [_row(ck)]
    parts = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(ck.parts.items(), key=lambda kv: -kv[1]))
    if parts:
        out.append(f"  parts: {parts}")
    for p in ck.problems:
        out.append(f"  partial: {printable(p, 300)}")
    if ck.universal:
        out.append(f"  universal conversion: {ck.universal} (loads on any world size with checkpoint.load_universal)")
    if ck.adapter:
        out.append(f"  adapter of {printable(str(ck.adapter.get('base_model')))}")
    if ck.complete and not ck.resumable:
        out.append("  no optimizer state: loads as weights, not as a training to continue")
    for n in ck.notes:
        out.append(f"  note: {printable(n, 300)}")
    return out


def _chosen(found, given: Path):
    """The checkpoint a conversion works on: DIR itself, or the last complete one under it."""
    if len(found.checkpoints) == 1 and Path(found.checkpoints[0].path) == given:
        return found.checkpoints[0]
    if found.last_complete is None:
        raise InputError("DIR", f"no complete checkpoint in {given}", "a complete checkpoint")
    return found.last_complete


def cmd_checkpoint(ns: argparse.Namespace) -> int:
    from wizard.checkpoint import convert, layout
    given = Path(ns.dir).absolute()
    if not given.is_dir():
        raise InputError("DIR", f"{ns.dir} is not a directory", "a checkpoint or an output directory")
    if ns.workers < 1:
        raise InputError("--workers", str(ns.workers), "1 or more")
    if (ns.merge_adapter or ns.base or ns.config) and not ns.export:
        raise InputError("--merge-adapter" if ns.merge_adapter else ("--base" if ns.base else "--config"),
                         "only applies with --export OUT", "--export OUT")
    found = layout.find(given)
    if not found.checkpoints:
        ck = layout.inspect(given)
        raise InputError("DIR", f"{given}: {ck.problems[0] if ck.problems else 'not a checkpoint'}",
                         "a checkpoint or an output directory holding checkpoint-N")
    done: list[str] = []
    if ns.universal or ns.export:
        ck = _chosen(found, given)
        if ns.universal:
            had = ck.universal
            tag = convert.to_universal(ck, workers=ns.workers)
            done.append(f"{ck.name}: universal checkpoint {tag} " + ("already there" if had == tag else "written"))
        if ns.export:
            said = convert.export(ck, ns.export, merge_adapter=ns.merge_adapter, base=ns.base, config=ns.config)
            done.append(f"{ck.name}: exported to {Path(ns.export).absolute()} ({'; '.join(said)})")
    if ns.json:
        print(json.dumps({**found.to_json(), "done": done}, indent=1, default=str))
        return 0
    for ck in found.checkpoints:
        for line in describe(ck):
            print(line)
    if len(found.checkpoints) > 1 or found.partial or not found.checkpoints[0].complete:
        last = found.last_complete
        print(f"last complete: {printable(last.name) if last else 'none'}"
              + (f"; partial after it: {', '.join(printable(c.name) for c in found.partial)}" if found.partial else ""))
    for line in done:
        print(line)
    sys.stdout.flush()
    return 0

