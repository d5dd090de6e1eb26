"""A checkpoint's conversions, by the libraries' own code, and what a resume on another layout needs.

- `to_universal`: DeepSpeed's universal checkpoint (deepspeed.checkpoint.ds_to_universal.main, the script DeepSpeed
  ships), written beside the tag as <tag>_universal with `latest_universal` naming it, as the script itself lays it
  out; a training loads it with `checkpoint.load_universal: true` on any world size of the same ZeRO family.
- `export`: a directory from_pretrained loads: DeepSpeed's zero_to_fp32 (convert_zero_checkpoint_to_fp32_state_dict),
  accelerate's merge_fsdp_weights (`accelerate merge-weights`), peft's merge_and_unload for an adapter where asked;
  a plain model's files are copied as they are. The model's config.json (and generation/tokenizer files) come
  from the checkpoint, or from --config.
- `resume_plan`: what the checkpoint needs to be loaded by the new layout (nothing, a universal conversion, or
  a refusal naming what the library cannot do).

Nothing is half-written: every output is made in a temporary directory beside its destination and renamed into
place; a failure removes it. The converters load the checkpoint as the libraries do (torch.load with
weights_only=False, DCP's pickled metadata): run them on checkpoints you or your training wrote.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wizard.checkpoint.layout import Checkpoint
from wizard.errors import InputError
from wizard.units import fmt_bytes

MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja",
               "added_tokens.json")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
# DeepSpeed's universal loader finds the model-states file by the loading stage's own name (mp_rank_* for ZeRO-1/2,
# zero_pp_rank_0_mp_rank_* for ZeRO-3), and ds_to_universal copies the saving stage's: across the two families the
# load finds none and DeepSpeed stops (`assert len(self.ckpt_list) > 0` in state_dict_factory, 0.19.0 and 0.19.8;
# tests/functional/test_checkpoint_resume.py shows the refusal at both ends of the supported range).
ZERO_FAMILIES = {1: "ZeRO-1/2", 2: "ZeRO-1/2", 3: "ZeRO-3"}


# Measured with DeepSpeed 0.19.0 and 0.19.8 (README's supported matrix): a ZeRO-3 checkpoint resumed through its
# universal conversion trains on, but not exactly as its own plain load does, on the same world size too.
ZERO3_UNIVERSAL_NOTE = ("DeepSpeed's ZeRO-3 universal load is not exact: measured, the losses after it drift from "
                        "those of a same-layout resume by about 1e-3 within three steps")


class ConversionError(InputError):
    """A conversion the library refused or that failed: one line, exit 2, nothing left behind."""

    def __init__(self, problem: str):
        super().__init__("checkpoint", problem)


def _free_bytes(path: Path) -> int:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def need_space(where: Path, need: int, what: str) -> None:
    free = _free_bytes(where)
    if free < need:
        raise ConversionError(f"{what} needs about {fmt_bytes(need)} at {where}, {fmt_bytes(free)} is free; "
                              "nothing written")


def _staging(dest: Path) -> Path:
    """A fresh temporary directory beside `dest` (same file system, so the final rename is atomic)."""
    tmp = dest.parent / f".{dest.name}.wizard-tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


@contextlib.contextmanager
def _quiet_library(what: str):
    """The library's prints and progress bars go to a buffer; its exception becomes one line naming it."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield buf
    except ConversionError:
        raise
    except (Exception, SystemExit) as exc:       # noqa: BLE001 - the library's refusal, said in one line
        text = str(exc).strip().splitlines()
        raise ConversionError(f"{what} failed: {type(exc).__name__}" + (f": {text[0][:300]}" if text else "")) \
            from exc


# ----------------------------------------------------------------------------- universal


def universal_tag(ck: Checkpoint) -> str:
    return f"{ck.ds_tag}_universal"


def to_universal(ck: Checkpoint, workers: int = 1) -> str:
    """Convert a complete DeepSpeed checkpoint to DeepSpeed's universal format beside it; the tag written (the
    existing one when the checkpoint already holds its conversion)."""
    if ck.kind != "deepspeed" or not ck.ds_tag:
        raise ConversionError(f"{ck.path} is not a DeepSpeed checkpoint ({ck.engine}): only DeepSpeed's ZeRO "
                              "checkpoints convert to its universal format")
    if not ck.complete:
        raise ConversionError(f"{ck.path} is partial ({ck.problems[0]}): not converted")
    root = Path(ck.path)
    tag = universal_tag(ck)
    if ck.universal == tag:
        return tag
    if (root / tag).exists():
        raise ConversionError(f"{root / tag} exists but `latest_universal` does not name it (an earlier conversion "
                              "cut short?): remove it and convert again")
    need_space(root, 2 * (ck.parts.get("optimizer", 0) + ck.parts.get("weights", 0)),
               "the universal conversion")
    staging = _staging(root / tag)
    try:
        from argparse import Namespace
        with _quiet_library("DeepSpeed's ds_to_universal"):
            from deepspeed.checkpoint import ds_to_universal
            ds_to_universal.main(Namespace(
                input_folder=str(root / ck.ds_tag), output_folder=str(staging / tag),
                num_extract_workers=max(1, workers), num_merge_workers=max(1, workers // 2),
                keep_temp_folder=False, strict=True,
                # a Trainer's checkpoint carries no universal_checkpoint_info (Megatron-DeepSpeed's client state):
                # the script's own flag adds the default one
                inject_missing_state=True))
        os.rename(staging / tag, root / tag)
        os.replace(staging / "latest_universal", root / "latest_universal")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    ck.universal = tag
    return tag


# ----------------------------------------------------------------------------- export


def _export_bytes(ck: Checkpoint) -> int:
    if ck.kind == "deepspeed":          # fp32 weights: a third of the optimizer's fp32 weights + two moments
        return max(ck.parts.get("optimizer", 0) // 3, ck.parts.get("weights", 0)) + (1 << 20)
    return ck.parts.get("weights", 0) + (1 << 20)


def _copy_model_files(src: Path, dst: Path, names) -> list[str]:
    copied = []
    for name in names:
        if (src / name).is_file() and not (src / name).is_symlink():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def _weights_files(src: Path) -> list[str]:
    return sorted(p.name for p in src.iterdir() if p.is_file() and (
        (p.name.startswith("model") and (p.name.endswith(".safetensors") or p.name.endswith(".safetensors.index.json")))
        or p.name.startswith("pytorch_model") and (p.name.endswith(".bin") or p.name.endswith(".bin.index.json"))))


def export(ck: Checkpoint, out: str | os.PathLike[str], merge_adapter: bool = False, base: str | None = None,
           config: str | None = None) -> list[str]:
    """Write a model from_pretrained loads into OUT (a new directory); the lines saying what was done."""
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError("--export", f"{dest} exists and is not an empty directory", "a new directory")
    if not ck.complete:
        raise ConversionError(f"{ck.path} is partial ({ck.problems[0]}): not exported")
    src = Path(ck.path)
    config_dir = Path(config) if config else src
    if ck.kind not in ("adapter",) and not (config_dir / "config.json").is_file():
        raise InputError("--config", f"no config.json in {config_dir} (from_pretrained needs the model's config; "
                                     "an FSDP sharded save writes none)", "the directory of the model's config.json")
    need_space(dest.parent if dest.parent.exists() else Path.cwd(), _export_bytes(ck), "the export")
    staging = _staging(dest)
    said: list[str] = []
    try:
        said += _write_weights(ck, src, staging, merge_adapter, base)
        if not merge_adapter or ck.kind != "adapter":
            copied = _copy_model_files(config_dir, staging, MODEL_FILES)
            if copied:
                said.append(f"copied {', '.join(copied)} from {config_dir}")
        if dest.exists():
            dest.rmdir()
        os.rename(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return said


def _write_weights(ck: Checkpoint, src: Path, staging: Path, merge_adapter: bool, base: str | None) -> list[str]:
    adapter_only = ck.adapter is not None and not ck.model_weights
    if merge_adapter:
        if ck.adapter is None:
            raise InputError("--merge-adapter", f"{src} holds no peft adapter", "an adapter checkpoint")
        return _merge_adapter(src, staging, base)
    if ck.kind == "deepspeed" and not adapter_only:
        with _quiet_library("DeepSpeed's zero_to_fp32"):
            from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
            convert_zero_checkpoint_to_fp32_state_dict(str(src), str(staging), safe_serialization=True,
                                                       tag=ck.ds_tag)
        return [f"fp32 weights gathered from the ZeRO-{ck.zero_stage} partitions of {ck.ds_tag} by DeepSpeed's "
                "zero_to_fp32"]
    if ck.kind == "fsdp" and ck.fsdp == "sharded":
        with _quiet_library("accelerate's merge_fsdp_weights"):
            from accelerate.utils import merge_fsdp_weights
            merge_fsdp_weights(str(src / "pytorch_model_fsdp_0"), str(staging), safe_serialization=True)
        return [f"FSDP shards of {ck.world_size} ranks merged by accelerate's merge_fsdp_weights"]
    if adapter_only:
        copied = _copy_model_files(src, staging, ADAPTER_FILES)
        return [f"adapter copied ({', '.join(copied)}): from_pretrained on the base model with peft loads it; "
                "--merge-adapter writes the merged model"]
    files = _weights_files(src)
    if not files:
        raise ConversionError(f"{src} holds no whole model weights to export ({ck.engine})")
    for name in files:
        shutil.copy2(src / name, staging / name)
    return [f"model weights copied ({', '.join(files)}): the checkpoint's own save_model output"]


def _merge_adapter(src: Path, staging: Path, base: str | None) -> list[str]:
    with _quiet_library("peft's merge_and_unload"):
        if base:
            from peft import PeftModel
            from transformers import AutoModelForCausalLM
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), str(src))
        else:
            from peft import AutoPeftModelForCausalLM
            model = AutoPeftModelForCausalLM.from_pretrained(str(src))
        merged = model.merge_and_unload()
        merged.save_pretrained(str(staging), safe_serialization=True)
    return [f"adapter merged into {base or 'its base model'} by peft's merge_and_unload"]


# ----------------------------------------------------------------------------- resume


@dataclass
class Target:
    """The layout a resumed run will train with (from its accelerate config and DeepSpeed JSON)."""
    backend: str                    # single | ddp | deepspeed | fsdp
    zero_stage: int | None
    world_size: int | None


@dataclass
class ResumePlan:
    checkpoint: Checkpoint
    universal: bool = False         # convert (if not yet) and load with checkpoint.load_universal
    refused: str | None = None      # why this checkpoint cannot be loaded by the new layout (one line)
    said: list[str] = field(default_factory=list)

    def env(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.path, "universal": self.universal}


def _ranks(n: int | None) -> str:
    return f"{n} rank{'s' if n != 1 else ''}" if n else "an unknown number of ranks"


def resume_plan(ck: Checkpoint, target: Target) -> ResumePlan:
    """What loading `ck` under `target` needs. A refusal says what the library cannot do, in one line."""
    plan = ResumePlan(ck)
    if ck.kind == "deepspeed":
        if target.backend != "deepspeed":
            plan.refused = (f"{ck.name} is a DeepSpeed checkpoint and the new config trains with {target.backend}: "
                            "only DeepSpeed reads ZeRO partitions (export it with `wizard checkpoint "
                            f"{ck.path} --export DIR` to start from its weights)")
            return plan
        stage = target.zero_stage
        same_world = ck.world_size == target.world_size
        if ck.zero_stage is not None and stage is not None and \
                ZERO_FAMILIES.get(ck.zero_stage) != ZERO_FAMILIES.get(stage):
            plan.refused = (f"DeepSpeed cannot load {ck.name} (ZeRO-{ck.zero_stage}) into ZeRO-{stage}: its "
                            "universal loader looks for the new stage's model-states files, which a "
                            f"ZeRO-{ck.zero_stage} conversion does not hold (it stops with an AssertionError); resume "
                            f"on a {ZERO_FAMILIES[ck.zero_stage]} rung, or export the weights")
            return plan
        if same_world and (stage == ck.zero_stage or stage is None):
            plan.said.append(f"{ck.name} ({ck.engine}) loads as it is: same layout")
            return plan
        plan.universal = True
        why = (f"{_ranks(ck.world_size)} -> {_ranks(target.world_size)}" if not same_world else
               f"ZeRO-{ck.zero_stage} -> ZeRO-{stage}")
        plan.said.append(f"{ck.name} ({ck.engine}) -> {why}: DeepSpeed's universal checkpoint "
                         "(ds_to_universal), loaded with checkpoint.load_universal")
        if 3 in (ck.zero_stage, stage):
            plan.said.append(ZERO3_UNIVERSAL_NOTE)
        return plan
    if ck.kind == "fsdp":
        if target.backend != "fsdp":
            plan.refused = (f"{ck.name} is an FSDP checkpoint and the new config trains with {target.backend}: "
                            f"export it with `wizard checkpoint {ck.path} --export DIR` to start from its weights")
            return plan
        if ck.fsdp == "per-rank" and ck.world_size != target.world_size:
            plan.refused = (f"{ck.name} holds per-rank FSDP shards of {_ranks(ck.world_size)} (accelerate's "
                            f"use_dcp=False): they load only on {_ranks(ck.world_size)}")
            return plan
        if ck.fsdp == "sharded" and ck.world_size != target.world_size:
            plan.said.append(f"{ck.name} ({ck.engine}) -> {_ranks(target.world_size)}: torch.distributed.checkpoint "
                             "reshards it as accelerate loads it (no conversion)")
        else:
            plan.said.append(f"{ck.name} ({ck.engine}) loads as it is")
        return plan
    if target.backend in ("deepspeed", "fsdp") and ck.kind in ("model", "adapter"):
        plan.refused = (f"{ck.name} is a {ck.engine} and the new config trains with {target.backend}: the Trainer "
                        "resumes an optimizer only from its own engine's checkpoint; start from its weights instead")
        return plan
    if not ck.resumable:
        plan.refused = f"{ck.name} holds no optimizer state ({ck.engine}): nothing to resume a training from"
        return plan
    plan.said.append(f"{ck.name} ({ck.engine}) loads as it is")
    return plan
