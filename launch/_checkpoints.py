"""The rank side of checkpoints, loaded by launch/_worker.py in every rank before the user's script runs.

Record. Rank 0 writes where the training saves its checkpoints into the run directory (RECORD_FILE, beside
run.json), so that `wizard runs` shows each run's last complete checkpoint and `wizard launch --resume RUN_DIR`
finds it: the output_dir and save settings of every HF TrainingArguments the script builds, and the directory of
every accelerate `Accelerator.save_state` (a plain accelerate loop).

Resume. `wizard launch --resume` finds the checkpoint (wizard/checkpoint), converts it where the new layout needs
it, and hands it here in WIZARD_RESUME (JSON: {"checkpoint": path, "universal": bool}):
- a Trainer resumes from it: `Trainer.train()` gets `resume_from_checkpoint=path` (whatever the script passed:
  None, True or a path of its own), and TrainingArguments' `resume_from_checkpoint` says it too, for scripts that
  pass that field on as the HF examples do. This is the route `wizard tune`'s probe takes to set Trainer arguments
  (a patch applied right after the script's own import of transformers; the script is not edited).
- `universal`: the checkpoint holds a DeepSpeed universal conversion (another world size or ZeRO stage): the
  DeepSpeed config the engine is built from gets `checkpoint.load_universal: true`, DeepSpeed's own switch for
  loading one (`latest_universal` then names the tag).
- a plain accelerate loop gets the path in WIZARD_RESUME_FROM, for its `accelerator.load_state(...)`.
Rank 0 says what it did in one line.

Nothing here imports torch, transformers or accelerate: they are hooked when the script imports them.
"""

from __future__ import annotations

import json
import os
import sys

ENV_RESUME = "WIZARD_RESUME"
ENV_RESUME_FROM = "WIZARD_RESUME_FROM"
RECORD_FILE = "checkpoints.json"


def is_rank0(environ=None) -> bool:
    return (environ if environ is not None else os.environ).get("RANK", "0") == "0"


def say(text: str) -> None:
    if is_rank0():
        sys.stdout.write(f"[wizard] {text}\n")
        sys.stdout.flush()


# ----------------------------------------------------------------------------- record


def write_record(run_dir: str, record: dict) -> None:
    """RECORD_FILE in the run directory, replaced whole (temp file + rename; never through a symlink)."""
    path = os.path.join(run_dir, RECORD_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _plain(value):
    """An enum (transformers' SaveStrategy) as its value; anything else as it is when JSON can hold it."""
    value = getattr(value, "value", value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)


def trainer_record(args) -> dict:
    return {"kind": "trainer", "output_dir": os.path.abspath(str(args.output_dir)),
            **{k: _plain(getattr(args, k, None)) for k in
               ("save_strategy", "save_steps", "save_total_limit", "save_only_model", "load_best_model_at_end")}}


def _record_training_args(run_dir: str):
    def patch(module) -> None:
        cls = module.TrainingArguments
        original = cls.__post_init__

        def __post_init__(self, *a, **kw):
            original(self, *a, **kw)
            if getattr(self, "output_dir", None):
                write_record(run_dir, trainer_record(self))

        cls.__post_init__ = __post_init__
    return patch


def _record_save_state(run_dir: str):
    def patch(module) -> None:
        cls = module.Accelerator
        original = cls.save_state

        def save_state(self, *a, **kw):
            saved = original(self, *a, **kw)
            if saved:
                write_record(run_dir, {"kind": "accelerate", "last_saved": os.path.abspath(str(saved)),
                                       "output_dir": os.path.dirname(os.path.abspath(str(saved)))})
            return saved

        cls.save_state = save_state
    return patch


# ----------------------------------------------------------------------------- resume


def resume_spec(environ=None) -> dict | None:
    raw = (environ if environ is not None else os.environ).get(ENV_RESUME)
    if not raw:
        return None
    spec = json.loads(raw)
    return spec if isinstance(spec, dict) and spec.get("checkpoint") else None


def _resume_training_args(path: str):
    def patch(module) -> None:
        cls = module.TrainingArguments
        original = cls.__post_init__

        def __post_init__(self, *a, **kw):
            original(self, *a, **kw)
            self.resume_from_checkpoint = path

        cls.__post_init__ = __post_init__
    return patch


def enable_universal_loading(trainer) -> bool:
    """DeepSpeed's switch for loading a universal checkpoint, in the config dict the engine will be built from (the
    accelerator's DeepSpeed plugin; the engine is made later, in train()). False: this Trainer runs no DeepSpeed."""
    state = getattr(getattr(trainer, "accelerator", None), "state", None)
    plugin = getattr(state, "deepspeed_plugin", None)
    config = getattr(plugin, "deepspeed_config", None)
    if not isinstance(config, dict):
        return False
    section = config.get("checkpoint")
    if not isinstance(section, dict):
        section = config["checkpoint"] = {}
    section["load_universal"] = True
    return True


def _resume_trainer(spec: dict):
    path = spec["checkpoint"]

    def patch(module) -> None:
        cls = module.Trainer
        original = cls.train
        done = []

        def train(self, resume_from_checkpoint=None, *a, **kw):
            if done:                       # a second train() in the same script is the script's own business
                return original(self, resume_from_checkpoint, *a, **kw)
            done.append(True)
            how = ""
            if spec.get("universal"):
                if not enable_universal_loading(self):
                    raise RuntimeError(f"wizard launch --resume: {path} holds a DeepSpeed universal checkpoint, "
                                       "but this Trainer runs without DeepSpeed")
                how = " (DeepSpeed universal checkpoint: checkpoint.load_universal on)"
            own = "" if resume_from_checkpoint in (None, False) else \
                f"; the script asked for resume_from_checkpoint={resume_from_checkpoint!r}"
            say(f"resuming the Trainer from {path}{how}{own}")
            return original(self, path, *a, **kw)

        cls.train = train
    return patch


def install() -> None:
    """Called by _worker.py before the script runs."""
    import _hooks                       # beside this file: the worker's sys.path[0] is launch/
    run_dir = os.environ.get("WIZARD_RUN_DIR")
    if run_dir and is_rank0() and not os.environ.get("WIZARD_PROBE"):     # a tune trial saves nothing of the user's
        _hooks.when_imported("transformers.training_args", _record_training_args(run_dir))
        _hooks.when_imported("accelerate.accelerator", _record_save_state(run_dir))
    spec = resume_spec()
    if spec is None:
        return
    os.environ[ENV_RESUME_FROM] = spec["checkpoint"]
    _hooks.when_imported("transformers.training_args", _resume_training_args(spec["checkpoint"]))
    _hooks.when_imported("transformers.trainer", _resume_trainer(spec))
