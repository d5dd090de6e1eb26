"""`wizard launch --resume [FROM]`: find the last complete checkpoint, make it loadable by the new layout, and hand
it to the training; and each run's last complete checkpoint for `wizard runs`.

FROM is a run directory (where its training saved, as its rank 0 recorded in checkpoints.json: launch/_checkpoints.py),
a training's output directory (its checkpoint-N), or one checkpoint; without FROM, the latest run under the runs root.
In an output directory the last complete checkpoint is taken; a newer one the job was killed while saving is named
and set aside (renamed partial-checkpoint-N, so the Trainer's rotation and the resumed run's own save of that step
never mix with it; nothing is deleted). The new layout (backend, ZeRO stage, processes) is read from the config the
launch runs; wizard/checkpoint says what loading needs: nothing, DeepSpeed's universal conversion (made here, beside
the tag), or a refusal in one line (exit 2, nothing changed). The training gets the checkpoint through WIZARD_RESUME
(the rank side: launch/_checkpoints.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launch import trust
from launch._checkpoints import ENV_RESUME, RECORD_FILE
from launch.runschema import SavesRecord
from wizard.checkpoint import layout
from wizard.errors import InputError
from wizard.schema import build

RECORD_MAX_BYTES = 1 << 16


@dataclass
class Resume:
    checkpoint: str
    universal: bool
    lines: list[str] = field(default_factory=list)      # what was found and done, said before the launch
    set_aside: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {ENV_RESUME: json.dumps({"checkpoint": self.checkpoint, "universal": self.universal})}

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint, "universal": self.universal, "set_aside": self.set_aside,
                "said": self.lines}


def recorded_output(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """checkpoints.json of a run directory of this user's (trust.read_private: never through a symlink), or None."""
    if trust.run_dir_problem(run_dir):
        return None
    try:
        body = json.loads(trust.read_private(Path(run_dir) / RECORD_FILE, RECORD_MAX_BYTES))
        return asdict(build(SavesRecord, body))
    except (OSError, ValueError, RecursionError):       # SchemaError is a ValueError
        return None


def last_checkpoint(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """For `wizard runs`: where the run saved, its last complete checkpoint and the partial ones after it (names and
    headers only: nothing loaded)."""
    record = recorded_output(run_dir)
    if record is None:
        return {"checkpoint_dir": None, "last_checkpoint": None, "partial_checkpoints": []}
    found = layout.find(record["output_dir"], deep=False)
    last = found.last_complete
    return {"checkpoint_dir": record["output_dir"], "last_checkpoint": last.path if last else None,
            "last_checkpoint_step": last.step if last else None,
            "partial_checkpoints": [c.path for c in found.partial]}


def _latest_run(runs_root: Path) -> Path | None:
    from launch.rundir import LATEST
    link = runs_root / LATEST
    return link.resolve() if link.exists() else None


def checkpoint_root(source: str | None, runs_root: Path) -> tuple[Path, str]:
    """(the directory to look in, what it is) for --resume's FROM."""
    if source is None:
        run = _latest_run(runs_root)
        if run is None:
            raise InputError("--resume", f"no run under {runs_root} to resume", "a run directory, an output "
                             "directory holding checkpoint-N, or a checkpoint")
        source = str(run)
    p = Path(source).absolute()
    if not p.is_dir():
        raise InputError("--resume", f"{source} is not a directory", "a run directory, an output directory holding "
                         "checkpoint-N, or a checkpoint")
    if (p / "run.json").is_file():
        problem = trust.run_dir_problem(p)
        if problem:
            raise InputError("--resume", f"{problem}; not read", "a run directory of your own")
        record = recorded_output(p)
        if record is None:
            raise InputError("--resume", f"{p} recorded no checkpoint directory (its training built no HF "
                             "TrainingArguments and called no accelerate save_state)", "the output directory or "
                             "the checkpoint itself")
        return Path(record["output_dir"]), f"the output directory run {p.name} recorded"
    return p, "the given directory"


def set_aside(ck: layout.Checkpoint) -> str:
    """Rename a partial checkpoint to partial-<name> (partial-<name>-2, ... when taken); the new path."""
    src = Path(ck.path)
    dest = src.with_name(layout.PARTIAL_PREFIX + src.name)
    n = 2
    while dest.exists():
        dest = src.with_name(f"{layout.PARTIAL_PREFIX}{src.name}-{n}")
        n += 1
    os.rename(src, dest)
    return str(dest)


def target_of(accel: dict[str, Any] | None) -> Any:
    """The layout the launch's config trains with, as wizard.checkpoint's Target."""
    from launch.accel_config import ds_config_path, world_size_of
    from wizard.checkpoint.convert import Target
    from wizard.fsutil import read_json_object
    from wizard.planning.rungs import strategy_from_files
    ds_path = ds_config_path(accel)
    ds = read_json_object(ds_path) if ds_path else None
    s = strategy_from_files(accel, ds)
    backend = s.backend if s is not None else "single"
    world = world_size_of(accel) or 1
    if backend == "single" and world > 1:
        backend = "ddp"
    return Target(backend, s.zero_stage if s is not None else None, world)


def prepare(source: str | None, runs_root: Path, accel: dict[str, Any] | None) -> Resume:
    """Find, check, set aside, convert: the Resume to launch with; InputError (exit 2, one line) when there is
    nothing to resume from or the new layout cannot load it (then nothing was changed)."""
    from wizard.checkpoint import convert
    root, what = checkpoint_root(source, runs_root)
    found = layout.find(root)
    lines = []
    explicit = len(found.checkpoints) == 1 and Path(found.checkpoints[0].path) == root
    if explicit:
        ck = found.checkpoints[0]
        if not ck.complete:
            raise InputError("--resume", f"{root} is a partial checkpoint ({ck.problems[0]}); the last complete one "
                             f"beside it: {_last_beside(root) or 'none'}", "a complete checkpoint")
        partial: list[layout.Checkpoint] = []
    else:
        ck = found.last_complete
        partial = found.partial
        if ck is None:
            named = "; ".join(f"{c.name}: {c.problems[0]}" for c in found.checkpoints) or "none found"
            raise InputError("--resume", f"no complete checkpoint in {root} ({what}): {named}",
                             "a directory holding a complete checkpoint-N")
    target = target_of(accel)
    plan = convert.resume_plan(ck, target)
    if plan.refused:
        raise InputError("--resume", plan.refused)
    out = Resume(ck.path, plan.universal)
    for p in partial:
        lines.append(f"{p.name} is partial ({p.problems[0]}); set aside as "
                     f"{os.path.basename(set_aside(p))}, resuming from the one before it")
        out.set_aside.append(p.path)
    lines.append(f"last complete checkpoint: {ck.path} (step {ck.step}, {ck.engine})")
    if plan.universal:
        had = ck.universal
        tag = convert.to_universal(ck)
        lines.append(("found" if had == tag else "wrote") + f" DeepSpeed's universal checkpoint {tag} beside it")
    lines += plan.said
    lines.append("the training resumes from it: Trainer.train(resume_from_checkpoint=...)"
                 + (" with checkpoint.load_universal" if plan.universal else "")
                 + f"; a plain accelerate loop finds the path in ${'WIZARD_RESUME_FROM'} for its load_state")
    out.lines = lines
    return out


def _last_beside(path: Path) -> str | None:
    found = layout.find(path.parent, deep=False)
    return found.last_complete.path if found.last_complete else None


def refusal_across(accel: dict[str, Any] | None, ds_config: dict[str, Any] | None, rung: dict[str, Any]) -> str | None:
    """Why this run's checkpoints could not be resumed on `rung` (the plan's next rung, as classify gives it), in
    the words of wizard.checkpoint's own rule; None when they can."""
    from wizard.checkpoint.convert import Target, resume_plan
    from wizard.planning.rungs import strategy_from_files
    s = strategy_from_files(accel, ds_config)
    if s is None:
        return None
    kind = {"deepspeed": "deepspeed", "fsdp": "fsdp"}.get(s.backend, "model")
    ck = layout.Checkpoint("this run's checkpoint", kind, zero_stage=s.zero_stage,
                           fsdp="sharded" if kind == "fsdp" else None, resumable=True)
    target = Target(str(rung.get("backend") or "single"), rung.get("zero_stage"), None)
    return resume_plan(ck, target).refused
