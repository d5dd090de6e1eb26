"""Answers: resolving the question table into values, and turning values into the planner's options.

Precedence is flags > answers file > defaults computed from the probe and the plan. Answers are a
plain dict {question id: normalised value}; questions that are not asked (their condition is false)
are absent. Every bad value raises InputError naming the flag (or, for a file entry, the key).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import fields, replace
from typing import Any, Iterable

from wizard.config.questions import QUESTIONS, STAGES, Context, Question, by_id, distributed_type_for
from wizard.errors import InputError
from wizard.planning.plan import Plan, StrategyOptions, Topology, TrainingOptions
from wizard.probe.hardware import Hardware

# Where each value came from, as `source_of` records it.
FROM_FLAG, FROM_FILE, FROM_DEFAULT = "flag", "file", "default"


def _stages(stage_or_stages: str | Iterable[str]) -> tuple[str, ...]:
    stages = (stage_or_stages,) if isinstance(stage_or_stages, str) else tuple(stage_or_stages)
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown stage {unknown[0]!r}; stages are {', '.join(STAGES)}")
    return stages


def _unknown_key(key: str) -> InputError:
    close = difflib.get_close_matches(key, [q.id for q in QUESTIONS], n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return InputError("answers", f"unknown key {key!r}{hint}", ", ".join(q.id for q in QUESTIONS))


def _field_name(q: Question, source: str | None) -> str:
    # A file entry is named by its key, a flag by the flag, so the user finds the line to fix.
    return q.id if source == FROM_FILE else q.field


def _relabel(e: InputError, q: Question, source: str | None) -> InputError:
    name = _field_name(q, source)
    if e.field == name:
        return e
    problem = e.problem + (" (answers file)" if source == FROM_FILE else "")
    return InputError(name, problem, e.allowed)


def resolve(stage_or_stages: str | Iterable[str], ctx: Context, given: dict[str, Any], *,
            source_of: dict[str, str] | None = None, ignored: list[str] | None = None,
            conflicts: list[InputError] | None = None, waive: Iterable[str] = ()) -> dict[str, Any]:
    """Answers for the questions of these stages, in asking order.

    For each question whose condition holds: the given value (parsed and validated), else the default.
    Questions not asked are omitted. `given` keys of other stages are left alone; a given value for a
    question of these stages that is not asked is type-checked and then listed in `ignored` (if passed).
    `source_of`, if passed, is read ('flag'/'file' entries from merge_given name the field in errors)
    and completed with 'default' for every answer that took its default. `conflicts`, if passed,
    receives an InputError for each given value that is not asked because of another given value
    (`--backend ddp --zero-stage 3`): the pairs come from the table's own conditions. Questions in `waive`
    may stay unanswered (None) where they are otherwise required: what only the written files need.
    """
    stages = _stages(stage_or_stages)
    for key in given:
        if key not in {q.id for q in QUESTIONS}:
            raise _unknown_key(key)
    sources = source_of if source_of is not None else {}
    working = dict(ctx.answers)
    local = replace(ctx, answers=working, given={**ctx.given, **given})
    out: dict[str, Any] = {}
    for q in QUESTIONS:
        if q.stage not in stages:
            continue
        raw = given.get(q.id)
        source = sources.get(q.id)
        if not q.ask_if(local):
            working.pop(q.id, None)
            if raw is not None:
                try:
                    q.coerce(raw, _field_name(q, source))
                except InputError as e:
                    raise _relabel(e, q, source) from None
                if ignored is not None:
                    ignored.append(q.id)
                if conflicts is not None:
                    culprits = blocking_answers(q, local, given)
                    if culprits:
                        conflicts.append(_conflict(q, raw, culprits, local.answers, source, sources))
            continue
        if raw is not None:
            try:
                value = q.parse(raw, local)
            except InputError as e:
                raise _relabel(e, q, source) from None
        else:
            value = q.default(local)
            reason = q.required(local) if value is None and q.id not in waive else None
            if reason:
                raise InputError(q.field, f"a value is required {reason}", q.allowed_text(local))
            if source_of is not None:
                source_of[q.id] = FROM_DEFAULT
        working[q.id] = value
        out[q.id] = value
    return out


class _ReadLog(dict):
    """The answers dict a condition sees, noting which keys it looked at."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: list[str] = []

    def get(self, key, default=None):
        self.read.append(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.append(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.append(key)
        return super().__contains__(key)


def blocking_answers(q: Question, ctx: Context, given: dict[str, Any]) -> list[str]:
    """The given answers that keep `q` from being asked: those its condition reads whose removal
    (back to the default) or another allowed value would have it asked. The plan is left out, so a
    backend the user chose counts while a backend the plan chose does not."""
    log = _ReadLog(ctx.answers)
    bare = replace(ctx, plan=None, answers=log)
    if q.ask_if(bare):
        return []
    culprits = []
    for key in dict.fromkeys(log.read):
        if key == q.id or given.get(key) is None or key not in ctx.answers:
            continue
        if ctx.answers[key] == by_id(key).default(replace(ctx, plan=None)):
            continue        # `--backend auto` restricts nothing: what excludes q then is the plan's choice
        if any(q.ask_if(replace(ctx, plan=None, answers=other)) for other in _other_answers(ctx.answers, key)):
            culprits.append(key)
    return culprits


def _other_answers(answers: dict[str, Any], key: str) -> Iterable[dict[str, Any]]:
    """`answers` with `key` back at its default, then at each other value its question allows."""
    yield {k: v for k, v in answers.items() if k != key}
    other = by_id(key)
    values = (True, False) if other.kind == "bool" else (other.choices or ())
    for value in values:
        if value != answers.get(key):
            yield {**answers, key: value}


def _conflict(q: Question, raw: Any, culprits: list[str], values: dict[str, Any], source: str | None,
              sources: dict[str, str]) -> InputError:
    """One line naming both answers: `zero-stage: '3' conflicts with --backend ddp (allowed: ...)`."""
    def name(qid: str) -> str:
        return f"{qid} (answers file)" if sources.get(qid) == FROM_FILE else (by_id(qid).flag or qid)

    with_what = " and ".join(f"{name(k)} {values.get(k)}" for k in culprits)
    mine = f"{q.id} (answers file)" if source == FROM_FILE else (q.flag or q.id)
    return InputError(_field_name(q, source), f"{_short(raw)} conflicts with {with_what}: "
                                              f"{mine} is not used with that answer",
                      f"drop {mine}, or change {' / '.join(name(k) for k in culprits)}")


def _short(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 60 else text[:40] + "...'"


def merge_given(flags: dict[str, Any], file: dict[str, Any], *,
                source_of: dict[str, str] | None = None) -> dict[str, Any]:
    """Flags win over the answers file; None means 'not given' in either."""
    merged: dict[str, Any] = {}
    for key, value in file.items():
        if value is not None:
            merged[key] = value
            if source_of is not None:
                source_of[key] = FROM_FILE
    for key, value in flags.items():
        if value is not None:
            merged[key] = value
            if source_of is not None:
                source_of[key] = FROM_FLAG
    return merged


ANSWERS_MAX_BYTES = 1024 * 1024   # a full answers file is a few KiB; a 100 MB one is a mistake, not a config


def load_answers_file(path: str) -> dict[str, Any]:
    """A YAML or JSON mapping of question ids to values, type-checked (not yet context-checked)."""
    from wizard.fsutil import loads_limited, quote_path, read_text_limited
    path = os.path.expanduser(str(path))
    text = read_text_limited(path, ANSWERS_MAX_BYTES, "answers", "a readable YAML or JSON file")
    kind = "json" if path.endswith(".json") else "yaml"   # JSON is YAML too: one parser covers the rest
    data = loads_limited(text, kind, "answers", quote_path(path), "a mapping of question ids to values")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError("answers", f"{quote_path(path)} holds a {type(data).__name__}, not a mapping",
                         "a mapping of question ids to values, e.g. seq_len: 4096")
    out: dict[str, Any] = {}
    known = {q.id for q in QUESTIONS}
    for key, value in data.items():
        if not isinstance(key, str) or key not in known:
            raise _unknown_key(str(key))
        if value is None:
            continue
        q = by_id(key)
        try:
            out[key] = q.coerce(value, key)
        except InputError as e:
            raise InputError(key, f"{e.problem} (answers file {os.path.basename(path)})", e.allowed) from None
    return out


# ----------------------------------------------------------------------------- converters

def _take(cls: type, a: dict[str, Any], rename: dict[str, str] | None = None) -> Any:
    rename = rename or {}
    names = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in a.items():
        name = rename.get(key, key)
        if name in names and value is not None:
            kwargs[name] = value
    return cls(**kwargs)


def training_options(a: dict[str, Any]) -> TrainingOptions:
    """TrainingOptions from answers. With a global batch, an unset micro-batch or accumulation (None: their
    default then) comes from it: the plan takes the fastest split of it (TrainingOptions.split)."""
    options = _take(TrainingOptions, a)
    if str(a.get("fsdp_version", 2)).strip() == "1" and a.get("method", "full") != "full":
        options = replace(options, reentrant_checkpoint_call=_transformers_reenters_call())
    if a.get("global_batch") is None:
        return options
    micro, accum = a.get("micro_batch") is not None, a.get("grad_accum") is not None
    split = "given" if micro and accum else "micro" if micro else "accum" if accum else "auto"
    return replace(options, split=split)


def _transformers_reenters_call() -> bool:
    """memory.checkpoint_reenters_call for the installed transformers, read from the package metadata without
    importing it. False when transformers is not installed here."""
    from importlib.metadata import PackageNotFoundError, version

    from wizard.sizing.memory import checkpoint_reenters_call
    try:
        return checkpoint_reenters_call(version("transformers"))
    except PackageNotFoundError:
        return False


def strategy_options(a: dict[str, Any]) -> StrategyOptions:
    return _take(StrategyOptions, a, {"cuda_context": "cuda_context_bytes", "parallelism_config_cp_size": "cp_size",
                                      "parallelism_config_sp_size": "sp_size"})


def topology(a: dict[str, Any], hw: Hardware) -> Topology:
    num_machines = int(a.get("num_machines", 1) or 1)
    num_processes = a.get("num_processes")
    if num_processes is None:
        num_processes = by_id("num_processes").default(Context(hardware=hw, answers=dict(a)))
    if num_processes % num_machines:
        raise InputError("num-processes", f"{num_processes} processes do not divide evenly over {num_machines} "
                                          "machines (num_processes is the total over all machines)",
                         f"a multiple of {num_machines}")
    return Topology(num_machines=num_machines, processes_per_machine=num_processes // num_machines,
                    cpu=bool(a.get("use_cpu", False)), inter_node_gbps=a.get("inter_node_gbps"))


def distributed_type(a: dict[str, Any], plan: Plan | None) -> str:
    """accelerate's distributed_type: plan backend single -> 'NO', ddp -> 'MULTI_GPU' ('MULTI_CPU' with
    use_cpu), deepspeed -> 'DEEPSPEED', fsdp -> 'FSDP'. One process on one machine is always 'NO',
    because accelerate refuses MULTI_GPU with a single process. Without a plan, the strategy answer."""
    return distributed_type_for(a, plan)


# ----------------------------------------------------------------------------- argparse

def _metavar(q: Question) -> str | None:
    if q.choices is not None and q.metavar is None:
        return "{" + ",".join(str(c) for c in q.choices) + "}"
    return q.metavar


def cli_arguments() -> list[tuple[str, dict[str, Any]]]:
    """(flag, add_argument kwargs) for every question with a flag, in asking order.

    Everything is type=str: values are parsed by the table so flag, file and screen errors read the
    same. Bool flags take an optional value (`--use-cpu` = `--use-cpu yes`). `group` is a title for an
    argument group; pop it before calling add_argument. No default is set: pass argparse.SUPPRESS or
    None, values_from_namespace handles both.
    """
    out = []
    for q in QUESTIONS:
        if not q.flag:
            continue
        text = q.prompt
        if q.choices is not None:
            text += f" ({'|'.join(str(c) for c in q.choices)})"
        kwargs: dict[str, Any] = {"dest": q.id, "type": str, "metavar": _metavar(q),
                                  "help": text.replace("%", "%%"),
                                  "group": q.stage if q.stage != "details" else f"details: {q.group}"}
        if q.kind == "bool":
            kwargs.update(nargs="?", const="yes")
        out.append((q.flag, kwargs))
    return out


def values_from_namespace(ns: Any) -> dict[str, Any]:
    """Only the question flags the user actually passed (absent or None means not passed)."""
    values = {}
    for q in QUESTIONS:
        if q.flag and getattr(ns, q.id, None) is not None:
            values[q.id] = getattr(ns, q.id)
    return values
