"""`wizard check`: read the configs on disk and say, before launch, what will go wrong, where, and how to fix it.

Inputs: accelerate's YAML (default: accelerate's default config file), the DeepSpeed JSON (default: the one
the YAML names; `--ds-config` or TrainingArguments(deepspeed=...) override), the TrainingArguments keyword
arguments the script passes (`--training-args`, JSON or YAML), a model (`--model`, sized on the meta device),
the hardware (this machine's probe, `--hardware FILE` or `--assume SPEC`) and which trainer fills `"auto"`
(`--trainer hf|accelerate`). Rules live in wizard/check/rules/ (one module per family); every claim a rule
makes about a library is checked against the installed library in tests/unit/test_check_library_facts.py.

Unreadable input raises InputError (exit 2). Findings never raise.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from wizard.check.rules.common import relative_to_naming_file
from wizard.config.vocab import DS_KEY_OF_YAML_KEY
from wizard.findings import Finding, finding_column_line
from wizard.errors import InputError
from wizard.paths import accelerate_default_config_file

TRAINERS = ("hf", "trl", "accelerate")


# ----------------------------------------------------------------------------- locating and reading


# Input limits: a config file is a few KiB; these bound what a mistaken path (/dev/zero, a FIFO, a log file)
# or a hostile file can cost before the first rule runs.
MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_NESTING = 64
MAX_INT_DIGITS = 40          # more digits than any count or byte size a config can mean (2**128 has 39)


def read_input(path: str, field_name: str) -> str:
    """The whole text of a regular file of at most MAX_INPUT_BYTES; InputError (exit 2) for anything else:
    the one place check reads a file, through fsutil's bounded, non-blocking reader (a FIFO or a device
    never blocks or streams forever)."""
    from wizard.fsutil import quote_path, read_text_limited
    if not os.path.lexists(path):
        raise InputError(field_name, f"{quote_path(path)} does not exist")
    return read_text_limited(path, MAX_INPUT_BYTES, field_name, "a readable config file")


def check_shape(data: Any, path: str, field_name: str) -> None:
    """Refuse nesting deeper than MAX_NESTING and integers longer than MAX_INT_DIGITS (exit 2)."""
    too_long = 10 ** MAX_INT_DIGITS            # once: computed per integer it was most of the walk's time
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            raise InputError(field_name, f"{path} nests deeper than {MAX_NESTING} levels")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, int) and not isinstance(node, bool) and abs(node) >= too_long:
            raise InputError(field_name, f"{path} holds an integer of more than {MAX_INT_DIGITS} digits")


def _parse_guard(exc: BaseException, path: str, field_name: str) -> InputError | None:
    """RecursionError (deep nesting) and ValueError (Python's int-digit limit) from a parser, as bad input."""
    if isinstance(exc, RecursionError):
        return InputError(field_name, f"{path} nests too deeply to parse")
    if isinstance(exc, ValueError) and "digits" in str(exc):
        return InputError(field_name, f"{path} holds a number too long to read ({_one_line(exc)})")
    return None


def parse_accelerate_yaml(text: str, path: str) -> tuple[dict[str, Any], dict]:
    """The YAML as accelerate loads it (yaml.safe_load) and every plain (unquoted) scalar by key path."""
    import yaml

    from wizard.check.rules.common import PlainScalar
    from wizard.fsutil import YamlExpansionError, yaml_load_errors, yaml_parse

    try:
        data, root = yaml_parse(text)
    except YamlExpansionError as exc:
        raise InputError("config-file", f"{path} is refused: {exc}") from None
    except (RecursionError, ValueError) as exc:
        guarded = _parse_guard(exc, path, "config-file")
        if guarded is not None:
            raise guarded from None
        # a value its tag can't take ("2024-13-45" is a date): accelerate's loader raises the same
        raise InputError("config-file", f"{path} is not valid YAML ({_one_line(exc)})") from None
    except yaml_load_errors() as exc:
        raise InputError("config-file", f"{path} is not valid YAML ({_one_line(exc)})") from None
    if data is None:
        raise InputError("config-file", f"{path} is empty (accelerate's loader crashes on an empty file)",
                         "an accelerate config written by `wizard` or `accelerate config`")
    if not isinstance(data, dict):
        raise InputError("config-file", f"{path} is a YAML {type(data).__name__}, not a mapping",
                         "an accelerate config written by `wizard` or `accelerate config`")
    check_shape(data, path, "config-file")
    plain: dict[tuple[str, ...], PlainScalar] = {}

    def visit(node, prefix: tuple[str, ...]) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key_node, value_node in node.value:
            path_ = prefix + (str(key_node.value),)
            if isinstance(value_node, yaml.ScalarNode):
                if value_node.style is None:
                    plain[path_] = PlainScalar(value_node.value, value_node.start_mark.line + 1, value_node.tag)
            else:
                visit(value_node, path_)

    visit(root, ())
    return data, plain


class _Obj(dict):
    """A JSON object that remembers which of its keys appeared more than once."""

    duplicates: list[str]


def _pairs(pairs: list[tuple[str, Any]]) -> _Obj:
    obj = _Obj()
    obj.duplicates = []
    for key, value in pairs:
        if key in obj and key not in obj.duplicates:
            obj.duplicates.append(key)
        obj[key] = value           # json.load's behaviour: the last one wins
    return obj


def parse_ds_json(text: str, path: str) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The ds_config as transformers reads it (json.load: strict, last duplicate wins) and its duplicate keys."""
    try:
        data = json.loads(text, object_pairs_hook=_pairs)
    except json.JSONDecodeError as exc:
        raise InputError("ds-config", f"{path} is not strict JSON (transformers reads it with json.load): "
                         f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (RecursionError, ValueError) as exc:
        guarded = _parse_guard(exc, path, "ds-config")
        if guarded is None:
            raise
        raise guarded from None
    if not isinstance(data, dict):
        raise InputError("ds-config", f"{path} is a JSON {type(data).__name__}, not an object")
    check_shape(data, path, "ds-config")
    duplicates: list[tuple[str, str]] = []

    def visit(node: Any, prefix: str) -> Any:
        if isinstance(node, dict):
            for key in getattr(node, "duplicates", []):
                duplicates.append((prefix, key))
            return {k: visit(v, f"{prefix}.{k}" if prefix else k) for k, v in node.items()}
        if isinstance(node, list):
            return [visit(v, prefix) for v in node]
        return node

    return visit(data, ""), duplicates


def load_training_args(path: str) -> tuple[dict[str, Any], list[str]]:
    """TrainingArguments keyword arguments from a JSON or YAML file, and the keys that are not ones.

    Training YAMLs as LLaMA-Factory, trl and axolotl write them mix TrainingArguments keys with model, data
    and framework keys: the TrainingArguments keys are taken, the others returned (reported in one info line).
    """
    text = read_input(path, "training-args")
    if path.endswith(".json"):
        parse, syntax_error = json.loads, json.JSONDecodeError
    else:
        from wizard.fsutil import yaml_load, yaml_load_errors
        parse, syntax_error = yaml_load, yaml_load_errors()
    from wizard.fsutil import YamlExpansionError
    try:
        data = parse(text)
    except YamlExpansionError as exc:
        raise InputError("training-args", f"{path} is refused: {exc}") from None
    except (RecursionError, ValueError) as exc:   # JSONDecodeError is a ValueError
        guarded = _parse_guard(exc, path, "training-args")
        if guarded is not None:
            raise guarded from None
        raise InputError("training-args", f"{path} cannot be parsed ({_one_line(exc)})") from None
    except syntax_error as exc:                   # YAML's, see fsutil.yaml_load_errors
        raise InputError("training-args", f"{path} cannot be parsed ({_one_line(exc)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError("training-args", f"{path} must hold a mapping of TrainingArguments keyword arguments")
    check_shape(data, path, "training-args")
    from wizard.check.rules.common import training_fields

    fields = training_fields()
    ignored = sorted(k for k in map(str, data) if k not in fields)
    if data and len(ignored) == len(data):
        raise InputError("training-args", f"{path} has no TrainingArguments field (keys: {', '.join(ignored[:8])}"
                         f"{', ...' if len(ignored) > 8 else ''})", "fields of transformers.TrainingArguments")
    return {k: v for k, v in data.items() if str(k) in fields}, ignored


def read_plan_beside(config_file: str) -> dict[str, Any] | None:
    """The wizard_plan.json the wizard wrote beside an accelerate config, None when there is none or it cannot be
    read (the rules then judge the files alone)."""
    from wizard.fsutil import read_json_object
    from wizard.paths import plan_file_beside
    path = plan_file_beside(config_file)
    return read_json_object(path) if os.path.isfile(path) else None      # a FIFO there must not block


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in ("accelerate", "deepspeed", "transformers", "torch"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def model_module_classes(model_id: str) -> set[str] | None:
    """Class names of every module of the model (meta build, no weights); None when it cannot be built,
    and the wrap-class rule falls back to ModelShape.layer_class."""
    from wizard.sizing.model import module_class_names

    try:
        return module_class_names(model_id)
    except InputError:
        return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


# ----------------------------------------------------------------------------- context


def build_context(config_file: str | None = None, ds_config: str | None = None, training_args: str | None = None,
                  model: str | None = None, hardware: Any = None, trainer: str = "hf", seq_len: int = 2048,
                  versions: dict[str, str | None] | None = None, use_default_config: bool = True,
                  port_in_use=None, method: Any = None, memlock_limit=None, sky_task: str | None = None):
    """Read every input. InputError (exit 2) for anything unreadable; problems inside readable files are
    left for the rules. `port_in_use` (port -> bool) and `memlock_limit` (() -> bytes, None for unlimited) stand
    for the live machine; None probes this one.
    `method`: wizard.sizing.lora.LoraOptions for --method lora/qlora (None: full fine-tuning)."""
    from wizard.check.rules import CheckContext

    if trainer not in TRAINERS:
        raise InputError("trainer", f"{trainer!r} is not a trainer", ", ".join(TRAINERS))
    ctx = CheckContext(trainer=trainer, seq_len=seq_len, hardware=hardware, port_in_use=port_in_use,
                       method=method, memlock_limit=memlock_limit)
    ctx.versions = versions if versions is not None else library_versions()

    acc_path = config_file
    if acc_path is None and use_default_config and ds_config is None and training_args is None:
        acc_path = accelerate_default_config_file()
        if not os.path.isfile(acc_path):
            raise InputError("config-file", f"no accelerate config at {acc_path} (accelerate's default)",
                             "--config-file P, --ds-config P or --training-args P")
    elif acc_path is None and use_default_config and os.path.isfile(accelerate_default_config_file()):
        acc_path = accelerate_default_config_file()   # accelerate launch uses it silently when it exists
    if acc_path is not None:
        ctx.acc_path = acc_path
        ctx.acc_text = read_input(acc_path, "config-file")
        ctx.acc, ctx.acc_plain = parse_accelerate_yaml(ctx.acc_text, acc_path)
        ctx.plan_beside = read_plan_beside(acc_path)

    if training_args is not None:
        ctx.ta_path = training_args
        ctx.ta, ctx.ta_ignored = load_training_args(training_args)

    _load_ds(ctx, ds_config)
    if sky_task is not None:
        ctx.sky_path, ctx.sky = sky_task, load_sky_task(sky_task)

    if model is not None:
        from wizard.sizing.model import size_model
        ctx.model_id = model
        ctx.model = size_model(model)
        ctx.module_classes = model_module_classes(model)
    return ctx


def load_sky_task(path: str) -> dict[str, Any]:
    """A SkyPilot task YAML (one mapping, SkyPilot's own loader is yaml.safe_load too), for the task rules."""
    from wizard.fsutil import YamlExpansionError, yaml_load, yaml_load_errors
    text = read_input(path, "sky-task")
    try:
        data = yaml_load(text)
    except YamlExpansionError as exc:
        raise InputError("sky-task", f"{path} is refused: {exc}") from None
    except (RecursionError, ValueError, *yaml_load_errors()) as exc:
        raise InputError("sky-task", f"{path} is not valid YAML ({_one_line(exc)})") from None
    if not isinstance(data, dict):
        raise InputError("sky-task", f"{path} is not a SkyPilot task (a YAML mapping with resources, num_nodes, run)")
    check_shape(data, path, "sky-task")
    return data


def _load_ds(ctx, ds_config: str | None) -> None:
    path, origin = ds_config, "--ds-config"
    ta_ds = ctx.ta_given("deepspeed")
    if path is None and isinstance(ta_ds, dict):
        ctx.ds, ctx.ds_from = copy.deepcopy(ta_ds), "training-args"
        ctx.ds_path = f"{ctx.ta_path}:deepspeed"
        return
    if path is None and isinstance(ta_ds, str) and ta_ds:
        path, origin = relative_to_naming_file(ta_ds, ctx.ta_path), "training-args"
        if not os.path.isfile(path):
            raise InputError("training-args", f"deepspeed={ta_ds!r}: {path} does not exist")
    if path is None and ctx.distributed_type == "DEEPSPEED":
        ref = ctx.acc_get("deepspeed_config", "deepspeed_config_file")
        if isinstance(ref, str) and ref:
            path, origin = relative_to_naming_file(ref, ctx.acc_path), "deepspeed_config_file"
            if not os.path.isfile(path):
                ctx.ds_missing_ref = ref
                return
    if path is None:
        _load_inline_ds(ctx)
        return
    ctx.ds_path, ctx.ds_from = path, origin
    ctx.ds_text = read_input(path, "ds-config")
    ctx.ds, ctx.ds_duplicates = parse_ds_json(ctx.ds_text, path)


def _load_inline_ds(ctx) -> None:
    """An inline `deepspeed_config` YAML (trl, alignment-handbook, peft style): the DeepSpeed config is what
    accelerate builds from it, so that is what the DeepSpeed rules and the Trainer comparison look at."""
    if ctx.distributed_type != "DEEPSPEED" or ctx.acc_get("deepspeed_config", "deepspeed_config_file"):
        return
    from wizard.check.rules.libraries import accelerate_built_ds

    built = accelerate_built_ds(ctx)
    if built is not None:
        ctx.ds, ctx.ds_from, ctx.ds_path = built, "accelerate-yaml", ctx.acc_path


# ----------------------------------------------------------------------------- running


def run_rules(ctx, only: set[str] | None = None) -> list[Finding]:
    from wizard.check.rules import RULES
    from wizard.check.rules.common import finding

    if ctx.ds is not None:
        # The DeepSpeed rules import deepspeed: do it the quiet way validation does (no "unable to
        # detect an accelerator" warning on a CPU box, no leaked DS_ACCELERATOR).
        from wizard.config.validate import preload
        preload()
    from wizard.libraries import IMPORT_LOCK

    findings: list[Finding] = []
    # The rules import accelerate, DeepSpeed and transformers as they need them: under the lock, so a front end's
    # background preload of the same libraries is never met half-way through accelerate's import cycle.
    with IMPORT_LOCK:
        for r in RULES:
            try:
                for f in r.func(ctx):
                    if only is None or f.rule in only:
                        findings.append(f)
            except Exception as exc:  # noqa: BLE001 - one broken rule must not hide the others
                findings.append(finding("warning", "CHECK-RULE-FAILED", ctx.acc_path or ctx.ds_path, None,
                                        f"rule {r.id} could not run: {exc.__class__.__name__}: {_one_line(exc)}",
                                        fix="report this as a wizard bug"))
    scratch = ctx.cache.pop("scratch_dir", None)
    if scratch:                       # the copy the libraries read (wizard/check/rules/yaml_verdicts.yaml_on_disk)
        import shutil
        shutil.rmtree(scratch, ignore_errors=True)
        ctx.cache.pop("acc_disk", None)
    if ctx.planned is not None:         # scratch copies of the files about to be written: name the final paths
        for f in findings:
            f.file = ctx.planned.displays.get(f.file, f.file)
    return sort_findings(_virtual_ds_keys(ctx, one_finding_per_problem(at_most_some_per_rule(_once_each(findings)))))


def at_most_some_per_rule(findings: list[Finding]) -> list[Finding]:
    """Past MAX_FINDINGS_PER_RULE findings of one rule and severity in one file, the rest become one finding
    that counts them (a rule that bounds itself already yields at most that many and its own summary)."""
    from wizard.check.rules.common import MAX_FINDINGS_PER_RULE, more_like_these

    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.rule, f.file, f.severity), []).append(f)
    out = []
    for (rule_id, file, severity), group in groups.items():
        if len(group) <= MAX_FINDINGS_PER_RULE + 1:
            out.extend(group)
            continue
        rest = group[MAX_FINDINGS_PER_RULE:]
        out.extend(group[:MAX_FINDINGS_PER_RULE])
        out.append(more_like_these(severity, rule_id, file, [f.key or "(file)" for f in rest],
                                   f"findings of {rule_id}", fix=rest[0].fix, when=rest[0].when))
    return out


def _once_each(findings: list[Finding]) -> list[Finding]:
    """One finding per (rule, file, key): a library's verdict and a rule can reach the same problem."""
    seen: set[tuple[str, str, str | None]] = set()
    out = []
    for f in findings:
        if (f.rule, f.file, f.key) not in seen:
            seen.add((f.rule, f.file, f.key))
            out.append(f)
    return out


def one_finding_per_problem(findings: list[Finding]) -> list[Finding]:
    """A library's verdict is dropped where another rule already reports the same problem: an error on the
    same file and key, or, for a verdict without a key, any error in the file set (the files are one
    configuration: accelerate's plugin raises on a DS JSON without zero_optimization; the rule names the
    cause, and once it is fixed a re-check shows whatever the library still rejects)."""
    from wizard.check.rules.libraries import LIBRARY_RULES

    specific = [f for f in findings if f.rule not in LIBRARY_RULES and f.severity == "error"]
    keys = {(f.file, f.key) for f in specific}
    out = []
    for f in findings:
        if f.rule in LIBRARY_RULES and ((f.file, f.key) in keys or (f.key is None and specific)):
            continue
        out.append(f)
    return out


# DeepSpeed keys accelerate builds from an inline YAML -> the YAML key the user writes
VIRTUAL_DS_KEYS = {ds_key: f"deepspeed_config.{key}" for key, ds_key in DS_KEY_OF_YAML_KEY.items()} | {
    "bf16.enabled": "mixed_precision", "fp16.enabled": "mixed_precision"}


def _virtual_ds_keys(ctx, findings: list[Finding]) -> list[Finding]:
    """Findings on the DeepSpeed config accelerate builds from an inline YAML name the YAML's keys, and
    cannot be fixed by rewriting a JSON that does not exist."""
    if not getattr(ctx, "ds_is_virtual", False):
        return findings
    for f in findings:
        if f.file == ctx.ds_path and f.rule.startswith("DS-"):
            f.key = VIRTUAL_DS_KEYS.get(f.key or "", f.key)
            f.fixable = False
    return findings


def sort_findings(findings: list[Finding]) -> list[Finding]:
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(findings, key=lambda f: (f.file, order.get(f.severity, 2), f.rule, f.key or ""))


def run_check(config_file: str | None = None, ds_config: str | None = None, training_args: str | None = None,
              model: str | None = None, hardware: Any = None, trainer: str = "hf", seq_len: int = 2048,
              versions: dict[str, str | None] | None = None, use_default_config: bool = True,
              port_in_use=None, method: Any = None, memlock_limit=None) -> list[Finding]:
    """Every finding for these inputs. Raises InputError for unreadable input."""
    ctx = build_context(config_file, ds_config, training_args, model, hardware, trainer, seq_len, versions,
                        use_default_config, port_in_use, method, memlock_limit)
    return run_rules(ctx)


def check_planned(yaml_path: str, ds_path: str | None, *, answers: dict[str, Any] | None, plan: Any, model: Any,
                  hardware: Any = None, method: Any = None, trainer: str | None = None, seq_len: int | None = None,
                  displays: dict[str, str] | None = None, port_in_use=None,
                  versions: dict[str, str | None] | None = None, memlock_limit=None) -> list[Finding]:
    """The check before a write: every rule, once, on the files about to be written (scratch copies at
    `yaml_path`/`ds_path`, named in the findings by `displays`), the libraries judging them against the plan
    (the "plan" rule) and the machine rules against `hardware` (None: none known, as for files read alone).
    The wizard writes nothing this reports as an error."""
    from wizard.check.rules.common import PlannedFiles

    trainer = trainer or str((answers or {}).get("trainer") or "hf")
    seq_len = seq_len or int((answers or {}).get("seq_len") or 2048)
    machine_known = hardware is not None
    if not machine_known:            # not this machine and no GPUs: the machine rules stay silent
        from types import SimpleNamespace
        hardware = SimpleNamespace(source="plan", gpus=[], all_bf16=True)
    displays = dict(displays or {})
    planned = PlannedFiles(answers=answers, plan=plan, model=model, displays=displays)
    try:
        ctx = build_context(config_file=yaml_path, ds_config=ds_path, hardware=hardware, trainer=trainer,
                            seq_len=seq_len, versions=versions, use_default_config=False,
                            port_in_use=port_in_use, method=method, memlock_limit=memlock_limit)
    except InputError:
        # Files the rules cannot read: the libraries' own verdict (the loader's finding) says why.
        from wizard.config.validate import library_findings
        return library_findings(yaml_path, ds_path, answers, plan, model, yaml_display=displays.get(yaml_path),
                                ds_display=displays.get(ds_path) if ds_path else None)
    ctx.model = model if machine_known else None       # the memory rules size the model on a known machine
    ctx.planned = planned
    return run_rules(ctx)


def check_texts(accelerate_yaml: str | None, ds_config: dict[str, Any] | str | None = None, *,
                accelerate_path: str = "default_config.yaml", ds_path: str = "ds_config.json",
                training_args: dict[str, Any] | None = None, model_shape: Any = None, model_id: str | None = None,
                hardware: Any = None, trainer: str = "hf", seq_len: int = 2048,
                versions: dict[str, str | None] | None = None, port_in_use=None,
                method: Any = None, memlock_limit=None) -> list[Finding]:
    """The same rules on files not yet written (what the wizard runs before it writes anything).

    `ds_config` may be the dict or the JSON text; paths are only used to name the files in the findings
    (and for the loader rule when the YAML already exists at accelerate_path).
    """
    from wizard.check.rules import CheckContext

    ctx = CheckContext(trainer=trainer, seq_len=seq_len, hardware=hardware, port_in_use=port_in_use, method=method,
                       memlock_limit=memlock_limit,
                       versions=versions if versions is not None else library_versions())
    if accelerate_yaml is not None:
        ctx.acc_path, ctx.acc_text = accelerate_path, accelerate_yaml
        ctx.acc, ctx.acc_plain = parse_accelerate_yaml(accelerate_yaml, accelerate_path)
    if ds_config is not None:
        text = ds_config if isinstance(ds_config, str) else json.dumps(ds_config)
        ctx.ds_path, ctx.ds_text, ctx.ds_from = ds_path, text, "--ds-config"
        ctx.ds, ctx.ds_duplicates = parse_ds_json(text, ds_path)
    if training_args is not None:
        ctx.ta, ctx.ta_path = dict(training_args), "<training-args>"
    if ds_config is None and ctx.acc is not None:
        _load_inline_ds(ctx)
    ctx.model, ctx.model_id = model_shape, model_id or getattr(model_shape, "source", None)
    if model_shape is not None and getattr(model_shape, "layer_class", None):
        ctx.module_classes = None
    return run_rules(ctx)


def has_errors(findings: list[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


# ----------------------------------------------------------------------------- --fix


@dataclass
class FixResult:
    changes: list[str] = field(default_factory=list)      # "path: what changed"
    written: list[str] = field(default_factory=list)      # files rewritten (each with a .bak of the old one)
    backups: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)      # fixable findings left alone, with why


def dump_accelerate_yaml(data: dict[str, Any], original_text: str) -> str:
    """Serialise like accelerate does (yaml.safe_dump, sorted keys; JSON when the file was JSON)."""
    if original_text.lstrip().startswith("{"):
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    import yaml

    return yaml.safe_dump(data, sort_keys=True)


def dump_ds_json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2) + "\n"


def apply_fixes(ctx, findings: list[Finding]) -> FixResult:
    """Apply every safe automatic fix, write the changed files atomically (a .bak keeps the old content)."""
    from wizard.check.rules import FIXERS
    from wizard.fsutil import write_atomic

    result = FixResult()
    by_rule: dict[str, list[Finding]] = {}
    for f in findings:
        if f.fixable and f.rule in FIXERS:
            by_rule.setdefault(f.rule, []).append(f)
    acc_before = copy.deepcopy(ctx.acc)
    ds_before = copy.deepcopy(ctx.ds)
    for rule_id, rule_findings in by_rule.items():
        target = rule_findings[0].file
        if target == ctx.ds_path and (ctx.ds_duplicates or ctx.ds_text is None):
            why = "duplicate keys: fix those by hand first" if ctx.ds_duplicates else \
                "built by accelerate from the YAML" if ctx.ds_is_virtual else "inline dict in training args"
            result.skipped.append(f"{rule_id}: {target} not rewritten ({why})")
            continue
        for line in FIXERS[rule_id](ctx, rule_findings):
            result.changes.append(f"{target}: [{rule_id}] {line}")
    if ctx.acc is not None and ctx.acc != acc_before and ctx.acc_path:
        write = write_atomic(ctx.acc_path, dump_accelerate_yaml(ctx.acc, ctx.acc_text or ""))
        result.written.append(ctx.acc_path)
        if write.backup_path:
            result.backups.append(write.backup_path)
    if ctx.ds is not None and ctx.ds != ds_before and ctx.ds_path and ctx.ds_text is not None:
        write = write_atomic(ctx.ds_path, dump_ds_json(ctx.ds))
        result.written.append(ctx.ds_path)
        if write.backup_path:
            result.backups.append(write.backup_path)
    return result


# ----------------------------------------------------------------------------- output


def format_findings(findings: list[Finding]) -> str:
    """One line per finding, grouped by file, errors first."""
    if not findings:
        return "No problems found."
    lines: list[str] = []
    current = None
    for f in sort_findings(findings):
        if f.file != current:
            current = f.file
            lines.append(f"{f.file}:")
        lines.append(finding_column_line(f))
    errors = sum(f.severity == "error" for f in findings)
    warnings = sum(f.severity == "warning" for f in findings)
    infos = len(findings) - errors - warnings
    lines.append(f"{errors} error(s), {warnings} warning(s)" + (f", {infos} note(s)." if infos else "."))
    return "\n".join(lines)
