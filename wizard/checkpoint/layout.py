"""What a checkpoint directory holds, and whether it is complete.

A checkpoint is recognised by the files its writer leaves, never by guessing:
- the HF Trainer's `checkpoint-<step>/`: trainer_state.json, written last, after every rank's engine files (a save
  the job was killed in has none), plus the engine's part below;
- DeepSpeed (`engine.save_checkpoint`, also inside a Trainer or accelerate checkpoint): `latest` names the tag
  directory; ZeRO-1/2 write one mp_rank_00_model_states.pt and an optimizer partition per rank, ZeRO-3 a model-states
  and an optimizer file per rank; the model-states file says the stage, the data-parallel world size, the step and
  the config it was saved with (read with torch.load(weights_only=True): tensors and plain data only). A universal
  conversion sits beside the tag as <tag>_universal, named by `latest_universal`;
- FSDP through accelerate: pytorch_model_fsdp_0/ and optimizer_0/ (torch.distributed.checkpoint, sharded: its
  `.metadata` is written by the coordinator after every rank's shards), or pytorch_model_fsdp.bin and optimizer.bin
  (a full state dict, rank 0), or per-rank files (accelerate's use_dcp=False);
- a transformers model (save_pretrained, the Trainer's save_model): config.json and model*.safetensors /
  pytorch_model*.bin; a peft adapter: adapter_config.json and adapter_model.*;
- accelerate's save_state: random_states_<rank>.pkl beside the model and optimizer files.
Every torch file must be a whole zip archive (torch.save's format: a cut file has no end record) and every
safetensors file must hold the bytes its header promises.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TRAINER_STATE = "trainer_state.json"
PARTIAL_PREFIX = "partial-"           # a cut save set aside by `wizard launch --resume`
_STEP_DIR = re.compile(r"^checkpoint[-_](\d+)$")
_TRAINER_DIR = re.compile(r"^(?:partial-)?checkpoint-(\d+)(?:-\d+)?$")     # set aside by --resume: still partial
_TAG = re.compile(r"^[\w.+-]{1,200}$")
_ZERO3_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
_OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MP_MODEL = re.compile(r"^mp_rank_(\d+)_model_states\.pt$")
_DCP_SHARD = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_FSDP_RANK_FILE = re.compile(r"^pytorch_model_fsdp(?:_\d+)?_rank(\d+)\.bin$")
_RANDOM_STATES = re.compile(r"^random_states_(\d+)\.pkl$")
_RNG_STATE = re.compile(r"^rng_state(?:_(\d+))?\.pth$")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".pkl")
MAX_JSON_BYTES = 64 << 20


@dataclass
class Checkpoint:
    path: str
    kind: str                                  # deepspeed | fsdp | model | adapter | accelerate | unknown
    step: int | None = None
    complete: bool = True
    problems: list[str] = field(default_factory=list)    # why it is not complete (or what else is off)
    trainer: bool = False                      # an HF Trainer checkpoint (trainer_state.json / checkpoint-N)
    resumable: bool = False                    # holds optimizer state a training can continue from
    zero_stage: int | None = None
    world_size: int | None = None
    ds_tag: str | None = None
    ds_version: str | None = None
    universal: str | None = None               # the tag of a DeepSpeed universal conversion beside it
    universal_world_size: int | None = None    # ... and the world size it came from
    fsdp: str | None = None                    # sharded | full | per-rank
    dtype: str | None = None
    bytes: int = 0
    parts: dict[str, int] = field(default_factory=dict)
    adapter: dict[str, Any] | None = None      # peft_type, r, base_model
    model_config: bool = False                 # config.json beside the weights (from_pretrained's)
    model_weights: bool = False                # whole model weights a from_pretrained loads (not ZeRO shards)
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip("/")) or self.path

    @property
    def engine(self) -> str:
        """The layout in words: "DeepSpeed ZeRO-2, 2 ranks", "FSDP sharded (DCP), 4 ranks", "model weights"."""
        ranks = f", {self.world_size} rank{'s' if self.world_size != 1 else ''}" if self.world_size else ""
        if self.kind == "deepspeed":
            stage = f"ZeRO-{self.zero_stage}" if self.zero_stage is not None else "ZeRO"
            return f"DeepSpeed {stage}{ranks}"
        if self.kind == "fsdp":
            what = {"sharded": "sharded (torch.distributed.checkpoint)", "full": "full state dict",
                    "per-rank": "per-rank shards"}.get(self.fsdp or "", "")
            return f"FSDP {what}{ranks}".replace("  ", " ")
        if self.kind == "adapter":
            a = self.adapter or {}
            return f"{a.get('peft_type') or 'peft'} adapter" + (f" r={a['r']}" if a.get("r") else "")
        if self.kind == "accelerate":
            return f"accelerate save_state{ranks}"
        if self.kind == "model":
            return "plain transformers checkpoint" if self.resumable else "model weights (no optimizer state)"
        return "not a checkpoint"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "engine": self.engine, "name": self.name}


# ----------------------------------------------------------------------------- files


def _tree(path: Path) -> list[tuple[str, int]]:
    """(relative path, size) of every regular file under path; symlinks are neither followed nor counted."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if os.path.isfile(full) and not os.path.islink(full):
                out.append((os.path.relpath(full, path), st.st_size))
    return sorted(out)


def read_json(path: Path) -> Any:
    """A small JSON file's content; None when it is missing, too large or not JSON."""
    try:
        if path.is_symlink() or path.stat().st_size > MAX_JSON_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def read_small_text(path: Path, limit: int = 4096) -> str | None:
    try:
        if path.is_symlink():
            return None
        with open(path, encoding="utf-8") as f:
            return f.read(limit).strip()
    except (OSError, UnicodeDecodeError):
        return None


def torch_file_problem(path: Path) -> str | None:
    """Why a torch.save file is cut or not one (None: a whole zip archive, as torch.save writes since torch 1.6)."""
    try:
        if path.stat().st_size == 0:
            return "is empty"
        if not zipfile.is_zipfile(path):
            return "is not a whole torch file (no zip end record: cut short)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    return None


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is cut or not one (None: its header parses and the data it describes is all there):
    the header is an 8-byte length and JSON whose data_offsets end where the file ends."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return "is cut short (no header)"
            n = int.from_bytes(head, "little")
            if n > min(size - 8, 100 << 20):
                return "is cut short (its header runs past the end)"
            header = json.loads(f.read(n))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return f"has no readable safetensors header ({exc})"
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)
               and isinstance(v.get("data_offsets"), list) and len(v["data_offsets"]) == 2), default=0)
    if 8 + n + end != size:
        return f"is cut short ({size:,} bytes of the {8 + n + end:,} its header describes)"
    return None


def safetensors_dtype(path: Path) -> str | None:
    """The dtype most of a safetensors file's bytes are in, from its header (F32, BF16, ...)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(min(n, 100 << 20)))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    weight: dict[str, int] = {}
    for k, v in header.items():
        if k != "__metadata__" and isinstance(v, dict) and "dtype" in v:
            a, b = v.get("data_offsets", [0, 0])
            weight[str(v["dtype"])] = weight.get(str(v["dtype"]), 0) + int(b) - int(a)
    return max(weight, key=weight.get) if weight else None


def file_problem(path: Path) -> str | None:
    if path.suffix in TORCH_SUFFIXES:
        return torch_file_problem(path)
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    return None


PARTS = (
    ("universal", re.compile(r"(^|/)[^/]+_universal/")),
    ("optimizer", re.compile(r"optim_states\.pt$|(^|/)optimizer[^/]*\.(pt|bin)$|(^|/)optimizer_\d+/")),
    ("weights", re.compile(r"\.safetensors$|(^|/)pytorch_model[^/]*\.bin$|(^|/)mp_rank_\d+_model_states\.pt$|"
                           r"(^|/)pytorch_model_fsdp_\d+/")),
    ("scheduler and RNG", re.compile(r"(^|/)(scheduler|rng_state|random_states|sampler|scaler)[^/]*$")),
)


def part_of(rel: str) -> str:
    for name, pattern in PARTS:
        if pattern.search(rel):
            return name
    return "other"


# ----------------------------------------------------------------------------- DeepSpeed


def deepspeed_model_states(path: Path) -> dict[str, Any] | None:
    """DeepSpeed's model-states file as plain data (weights_only: tensors, dicts and numbers only; a file that needs
    more is not unpickled), or None."""
    try:
        import torch
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:       # noqa: BLE001 - an unreadable file is described by the file checks, never raised
        return None
    return sd if isinstance(sd, dict) else None


def _module_dtype(states: dict[str, Any]) -> str | None:
    module = states.get("module")
    if not isinstance(module, dict):
        return None
    counts: dict[str, int] = {}
    for v in module.values():
        dtype, numel = getattr(v, "dtype", None), getattr(v, "numel", None)
        if dtype is not None and numel is not None:
            counts[str(dtype).replace("torch.", "")] = counts.get(str(dtype).replace("torch.", ""), 0) + int(numel())
    return max(counts, key=counts.get) if counts else None


def _config_dtype(ds_config: Any) -> str | None:
    if not isinstance(ds_config, dict):
        return None
    for key, name in (("bf16", "bfloat16"), ("fp16", "float16")):
        section = ds_config.get(key)
        if isinstance(section, dict) and section.get("enabled") is True:
            return name
    return None


def inspect_deepspeed(ck: Checkpoint, root: Path, deep: bool) -> None:
    latest = read_small_text(root / "latest")
    tags = sorted(p.name for p in root.glob("global_step*") if p.is_dir() and not p.name.endswith("_universal"))
    tag = latest if latest and _TAG.match(latest) else None
    if tag is None:
        ck.complete = False
        ck.problems.append("no `latest` file naming the DeepSpeed tag (DeepSpeed writes it after the ranks' files)"
                           if tags else "DeepSpeed's `latest` names no tag directory")
        tag = tags[-1] if tags else None
    if tag is None or not (root / tag).is_dir():
        ck.complete = False
        ck.problems.append(f"DeepSpeed tag directory {tag!r} is missing")
        return
    ck.ds_tag = tag
    names = [p.name for p in (root / tag).iterdir() if p.is_file()]
    zero3 = sorted(int(m.group(1)) for m in map(_ZERO3_MODEL.match, names) if m)
    optim = sorted(int(m.group(1)) for m in map(_OPTIM.match, names) if m)
    mp = [n for n in names if _MP_MODEL.match(n)]
    states_file = (root / tag / (f"zero_pp_rank_0_mp_rank_00_model_states.pt" if zero3 else
                                 "mp_rank_00_model_states.pt"))
    states = deepspeed_model_states(states_file) if deep and states_file.is_file() else None
    world = None
    if states is not None:
        cfg = states.get("ds_config")
        stage = ((cfg or {}).get("zero_optimization") or {}).get("stage") if isinstance(cfg, dict) else None
        ck.zero_stage = int(stage) if isinstance(stage, int) else (3 if zero3 else None)
        world = states.get("dp_world_size") if isinstance(states.get("dp_world_size"), int) else None
        if isinstance(states.get("global_steps"), int) and ck.step is None:
            ck.step = states["global_steps"]
        ck.ds_version = str(states.get("ds_version")) if states.get("ds_version") else None
        ck.dtype = ck.dtype or _module_dtype(states) or _config_dtype(cfg) or None
    else:
        ck.zero_stage = 3 if zero3 else None       # ZeRO-1 or 2 share one layout: the file says which
    ck.world_size = world or (len(optim) or len(zero3) or None)
    expected = range(ck.world_size or 0)
    if zero3:
        missing = [r for r in expected if r not in zero3]
        if missing:
            ck.complete = False
            ck.problems.append(f"ZeRO-3 model states of rank{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(map(str, missing))} missing in {tag}/")
    elif not mp:
        ck.complete = False
        ck.problems.append(f"{tag}/mp_rank_00_model_states.pt is missing")
    missing = [r for r in expected if r not in optim]
    if missing:
        ck.complete = False
        ck.problems.append(f"optimizer partition{'s' if len(missing) > 1 else ''} of rank"
                           f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} missing in {tag}/")
    ck.resumable = bool(optim)
    universal = read_small_text(root / "latest_universal")
    if universal and _TAG.match(universal) and (root / universal / "zero").is_dir():
        ck.universal = universal
        ck.universal_world_size = ck.world_size


# ----------------------------------------------------------------------------- FSDP, accelerate, models


def inspect_fsdp(ck: Checkpoint, root: Path, names: set[str]) -> None:
    sharded = sorted(p for p in root.glob("pytorch_model_fsdp_*") if p.is_dir())
    if sharded:
        ck.fsdp = "sharded"
        shards = [m for m in (_DCP_SHARD.match(p.name) for p in sharded[0].iterdir()) if m]
        ck.world_size = len({m.group(1) for m in shards}) or None
        for d in sharded + sorted(p for p in root.glob("optimizer_*") if p.is_dir()):
            if not (d / ".metadata").is_file():
                ck.complete = False
                ck.problems.append(f"{d.name}/.metadata is missing (torch.distributed.checkpoint writes it after "
                                   "every rank's shards)")
        ck.resumable = any(p.is_dir() and (p / ".metadata").is_file() for p in root.glob("optimizer_*"))
    elif any(_FSDP_RANK_FILE.match(n) for n in names):
        ck.fsdp = "per-rank"
        ranks = {int(m.group(1)) for m in map(_FSDP_RANK_FILE.match, names) if m}
        ck.world_size = len(ranks)
        ck.resumable = any(n.startswith("optimizer") for n in names)
    else:
        ck.fsdp = "full"
        ck.resumable = "optimizer.bin" in names or any(re.match(r"^optimizer_\d+\.bin$", n) for n in names)


def inspect_adapter(ck: Checkpoint, root: Path) -> None:
    cfg = read_json(root / "adapter_config.json") or {}
    ck.adapter = {"peft_type": cfg.get("peft_type"), "r": cfg.get("r"),
                  "base_model": cfg.get("base_model_name_or_path")}


def weights_dtype(root: Path, files: list[tuple[str, int]]) -> str | None:
    for rel, _size in files:
        if rel.endswith(".safetensors") and "/" not in rel:
            d = safetensors_dtype(root / rel)
            if d:
                return {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(d, d.lower())
    return None


def _step_from_name(name: str) -> int | None:
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def inspect(path: str | os.PathLike[str], deep: bool = True) -> Checkpoint:
    """What the directory holds. `deep` reads DeepSpeed's model-states file (torch, weights_only) for the stage,
    the world size it was saved with, the step and the dtype; without it only names, headers and JSON are read."""
    root = Path(path)
    ck = Checkpoint(str(root), "unknown")
    if not root.is_dir() or root.is_symlink():
        ck.complete = False
        ck.problems.append("not a directory")
        return ck
    files = _tree(root)
    names = {rel for rel, _ in files if "/" not in rel}
    ck.bytes = sum(size for _, size in files)
    for rel, size in files:
        ck.parts[part_of(rel)] = ck.parts.get(part_of(rel), 0) + size
    named = _TRAINER_DIR.match(root.name)
    ck.step = _step_from_name(root.name) if not named else int(named.group(1))
    state = read_json(root / TRAINER_STATE) if TRAINER_STATE in names else None
    # training_args.bin: the Trainer's save_model writes it first, trainer_state.json last
    ck.trainer = state is not None or bool(named) or "training_args.bin" in names
    if isinstance(state, dict) and isinstance(state.get("global_step"), int):
        ck.step = state["global_step"]
    ck.model_config = "config.json" in names
    ck.model_weights = any(n.endswith(".safetensors") and n.startswith("model") or
                           re.match(r"^pytorch_model(-\d+-of-\d+)?\.bin$", n) for n in names)
    if "latest" in names or any(p.is_dir() for p in root.glob("global_step*")):
        ck.kind = "deepspeed"
        inspect_deepspeed(ck, root, deep)
    elif any(n.startswith("pytorch_model_fsdp") for n in names) or (root / "pytorch_model_fsdp_0").is_dir():
        ck.kind = "fsdp"
        inspect_fsdp(ck, root, names)
    elif any(_RANDOM_STATES.match(n) for n in names):
        ck.kind = "accelerate"
        ck.world_size = len([n for n in names if _RANDOM_STATES.match(n)])
        ck.resumable = any(n.startswith("optimizer") for n in names)
    elif "adapter_config.json" in names:
        ck.kind = "adapter"
        ck.resumable = "optimizer.pt" in names
    elif ck.model_weights:
        ck.kind = "model"
        ck.resumable = "optimizer.pt" in names
    if "adapter_config.json" in names:
        inspect_adapter(ck, root)
    if ck.kind == "unknown":
        ck.complete = False
        ck.problems.append("holds no checkpoint this wizard knows (no DeepSpeed `latest`, FSDP, accelerate "
                           "save_state, adapter or model weights)")
        return ck
    if ck.kind == "model" and ck.world_size is None:
        ranks = [m for m in map(_RNG_STATE.match, names) if m]
        ck.world_size = len(ranks) or None
    ck.dtype = ck.dtype or weights_dtype(root, files)
    if ck.trainer and state is None:
        ck.complete = False
        ck.problems.insert(0, f"no {TRAINER_STATE}, which the Trainer writes last: the save was cut short")
    for rel, _size in files:
        if "_universal/" in rel:
            continue
        problem = file_problem(root / rel)
        if problem:
            ck.complete = False
            ck.problems.append(f"{rel} {problem}")
    if state is not None and ck.step is not None and _step_from_name(root.name) not in (None, ck.step):
        ck.notes.append(f"{TRAINER_STATE} says step {ck.step}, the directory's name step {_step_from_name(root.name)}")
    return ck


# ----------------------------------------------------------------------------- an output directory


def candidates(root: Path) -> list[Path]:
    """The checkpoint directories directly under root (checkpoint-N, checkpoint_N, and partial-checkpoint-N that a
    resume set aside); root itself when it is one."""
    if not root.is_dir():
        return []
    if _STEP_DIR.match(root.name) or _TRAINER_DIR.match(root.name) or (root / TRAINER_STATE).is_file():
        return [root]
    out = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and (_STEP_DIR.match(child.name) or
                                                          _TRAINER_DIR.match(child.name)):
            out.append(child)
    if not out and (root / "checkpoints").is_dir():          # accelerate's automatic naming: project/checkpoints/
        out = candidates(root / "checkpoints")
    # an output directory's own final model (save_model) beside its checkpoint-N is not one of them
    return out or ([root] if _holds_one(root) else [])


def _holds_one(root: Path) -> bool:
    """root itself is a checkpoint (by the files its writer leaves; nothing is read)."""
    try:
        names = {p.name for p in root.iterdir()}
    except OSError:
        return False
    return bool(names & {TRAINER_STATE, "latest", "adapter_config.json", "pytorch_model_fsdp_0", "pytorch_model_fsdp.bin"}
                or any(_RANDOM_STATES.match(n) for n in names)
                or ("config.json" in names and any(n.startswith("model") and n.endswith(".safetensors") for n in names)))


@dataclass
class Found:
    """The checkpoints under an output directory, oldest step first, and the last complete one."""
    root: str
    checkpoints: list[Checkpoint]
    last_complete: Checkpoint | None
    partial: list[Checkpoint]           # incomplete ones newer than the last complete one (not yet set aside)

    def to_json(self) -> dict[str, Any]:
        return {"root": self.root, "checkpoints": [c.to_json() for c in self.checkpoints],
                "last_complete": None if self.last_complete is None else self.last_complete.path,
                "partial": [c.path for c in self.partial]}


def find(root: str | os.PathLike[str], deep: bool = True) -> Found:
    base = Path(root)
    found = [inspect(p, deep=deep) for p in candidates(base)]
    found = [c for c in found if c.kind != "unknown" or c.trainer]
    found.sort(key=lambda c: (c.step if c.step is not None else -1, c.path))
    last = next((c for c in reversed(found) if c.complete), None)
    after = [c for c in found if not c.complete and not c.name.startswith(PARTIAL_PREFIX)
             and (last is None or (c.step or -1) > (last.step or -1))]
    return Found(str(base), found, last, after)
