"""The fuzz tier's inputs: every kind of input the wizard reads, mutated from real examples by a seeded mutator.

Each kind starts from files the project already holds (the golden config sets, the model configs of the tests'
fixtures, a real run directory) and mutates them the ways real inputs go wrong: a value of the wrong type or out of
every range (zero, negative, the smallest and largest floats, NaN, 10^45), strings no printer expects (lone
surrogates, terminal escapes, newlines, 5,000 characters), keys nobody reads (thousands of them), missing keys,
deep nesting, and text cut short or with bytes spliced in. The flags get every such value, one flag at a time.

Everything is decided by the seed: the same seed gives the same cases, so a failure is a case to rerun.
"""

from __future__ import annotations

import copy
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "snapshots" / "golden"
MODELS = REPO / "tests" / "fixtures" / "models"

# Values no input should be trusted to avoid. Floats the JSON writer spells as NaN / Infinity literals.
NASTY_NUMBERS: tuple[Any, ...] = (0, -1, -2, 1e-308, 5e-324, 1e308, math.nan, math.inf, -math.inf, 10 ** 45,
                                  2 ** 63, 0.5, True, None)
NASTY_STRINGS: tuple[str, ...] = ("\ud800", "x\udfff", "\ud83d", "\x1b[31mred\x1b[0m\x1b]0;title\x07", "two\nlines",
                                  "", " ", "a" * 5000, "auto", "NaN", "-1", "1e-308", "\u202eevil", "\x00nul",
                                  "../../etc/passwd", "-oProxyCommand=x")
NASTY_STRUCTURES: tuple[Any, ...] = ([], {}, [1, "a", None], {"\ud800": "\x1b[2J"})
# A command line cannot carry a NUL, and argparse reads a leading '-' as a flag: what a user can type.
NASTY_FLAG_VALUES: tuple[str, ...] = ("0", "-1", "1e-308", "5e-324", "1e308", "nan", "inf", "-inf",
                                      "1" + "0" * 45, "0.5", "1e400", "", " ", "\ud800", "x" * 5000, "\x1b[2J")
MANY_KEYS = 20_000            # 2,000 unknown keys took `wizard check` 10.7 s before its findings were bounded


def nasty_value(rng: random.Random) -> Any:
    pool = rng.choice((NASTY_NUMBERS, NASTY_NUMBERS, NASTY_STRINGS, NASTY_STRINGS, NASTY_STRUCTURES))
    return copy.deepcopy(rng.choice(pool))


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value of nested dicts and lists."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.append(prefix + (i,))
            out.extend(_paths(v, prefix + (i,)))
    return out


def _parent(doc: Any, path: tuple) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def _dicts(doc: Any) -> list[dict]:
    found = [doc] if isinstance(doc, dict) else []
    return found + [v for p in _paths(doc) for v in [_get(doc, p)] if isinstance(v, dict)]


def _get(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def replace_a_value(doc: Any, rng: random.Random) -> str:
    paths = _paths(doc)
    if not paths:
        return "nothing to replace"
    path = rng.choice(paths)
    value = nasty_value(rng)
    _parent(doc, path)[path[-1]] = value
    return f"{'.'.join(map(str, path))} = {value!r:.40}"


def add_a_key(doc: Any, rng: random.Random) -> str:
    target = rng.choice(_dicts(doc) or [doc])
    key = rng.choice(NASTY_STRINGS) or "k"
    target[key] = nasty_value(rng)
    return f"added {key!r:.40}"


def drop_a_key(doc: Any, rng: random.Random) -> str:
    paths = [p for p in _paths(doc) if isinstance(_parent(doc, p), dict)]
    if not paths:
        return "nothing to drop"
    path = rng.choice(paths)
    del _parent(doc, path)[path[-1]]
    return f"dropped {'.'.join(map(str, path))}"


def nest_deeply(doc: Any, rng: random.Random) -> str:
    deep: Any = 1
    for _ in range(rng.choice((40, 70, 200))):
        deep = {"n": deep}
    rng.choice(_dicts(doc) or [doc])["deep"] = deep
    return "nested deeply"


def many_unknown_keys(doc: Any, rng: random.Random) -> str:
    target = doc if isinstance(doc, dict) else {}
    for i in range(MANY_KEYS):
        target[f"unknown_{i}"] = i
    return f"{MANY_KEYS} unknown keys"


STRUCTURED: tuple[Callable[[Any, random.Random], str], ...] = (
    replace_a_value, replace_a_value, replace_a_value, add_a_key, add_a_key, drop_a_key, nest_deeply)


def mutate_doc(doc: Any, rng: random.Random, blow_up: bool = False) -> tuple[Any, list[str]]:
    doc = copy.deepcopy(doc)
    done = [many_unknown_keys(doc, rng)] if blow_up else []
    for _ in range(rng.choice((1, 1, 2, 3))):
        done.append(rng.choice(STRUCTURED)(doc, rng))
    return doc, done


def to_text(doc: Any, rng: random.Random) -> tuple[str, str]:
    """JSON text (YAML reads it too), sometimes cut short or with bytes spliced in."""
    text = json.dumps(doc, indent=1, allow_nan=True)
    roll = rng.random()
    if roll < 0.08:
        return text[: rng.randrange(len(text) + 1)], "cut short"
    if roll < 0.16:
        at = rng.randrange(len(text) + 1)
        junk = rng.choice(("\x00", "\ufeff", "*&anchor", "!!python/object/apply:os.system ['true']", "}}}",
                           "\udcff", "'", "\t-\t"))
        return text[:at] + junk + text[at:], f"spliced {junk!r}"
    return text, ""


@dataclass
class Case:
    kind: str
    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)       # name in the case dir -> text
    what: str = ""
    writes_to: str | None = None      # a folder the command may write into on success (nothing on failure)
    dirs: dict[str, dict[str, str]] = field(default_factory=dict)   # a folder of files (a model, a run dir)


def _golden(name: str) -> list[Any]:
    out = []
    for d in sorted(GOLDEN.iterdir()):
        p = d / name
        if p.is_file():
            text = p.read_text()
            out.append(json.loads(text) if name.endswith(".json") else __import__("yaml").safe_load(text))
    return out


def ds_config_cases(rng: random.Random, n: int) -> list[Case]:
    corpus = _golden("ds_config.json")
    cases = []
    for i in range(n):
        doc, done = mutate_doc(rng.choice(corpus), rng, blow_up=(i == 0))
        text, how = to_text(doc, rng)
        cases.append(Case("ds-config", ["check", "--ds-config", "ds.json"], {"ds.json": text},
                          "; ".join(done + [how])))
    return cases


def accelerate_yaml_cases(rng: random.Random, n: int) -> list[Case]:
    corpus = _golden("default_config.yaml")
    cases = []
    for i in range(n):
        doc, done = mutate_doc(rng.choice(corpus), rng, blow_up=(i == 0))
        text, how = to_text(doc, rng)
        cases.append(Case("accelerate-yaml", ["check", "--config-file", "c.yaml"], {"c.yaml": text},
                          "; ".join(done + [how])))
    return cases


TRAINING_ARGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
                 "gradient_checkpointing": True, "learning_rate": 2e-5, "num_train_epochs": 1,
                 "output_dir": "out", "save_total_limit": 2, "logging_steps": 10}


def training_args_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        doc, done = mutate_doc(TRAINING_ARGS, rng, blow_up=(i == 0))
        text, how = to_text(doc, rng)
        cases.append(Case("training-args", ["check", "--training-args", "args.json"], {"args.json": text},
                          "; ".join(done + [how])))
    return cases


def model_config_cases(rng: random.Random, n: int) -> list[Case]:
    names = ["llama-tiny", "mixtral-tiny", "gpt2-tiny", "qwen2-tiny-tied", "llava-tiny"]
    corpus = [json.loads((MODELS / m / "config.json").read_text()) for m in names]
    cases = []
    for _ in range(n):
        base = rng.choice(corpus)
        doc, done = mutate_doc(base, rng)
        if rng.random() < 0.5:          # a shape number of a real model, out of every range
            key = rng.choice([k for k, v in base.items() if isinstance(v, int) and not isinstance(v, bool)] or ["x"])
            doc[key] = rng.choice(NASTY_NUMBERS)
            done.append(f"{key} = {doc[key]!r}")
        if isinstance(doc, dict) and "model_type" not in doc:
            doc["model_type"] = base["model_type"]
        text, how = to_text(doc, rng)
        cases.append(Case("model-config", ["plan", "--model", "model", "--assume", "1xH100-80GB"],
                          dirs={"model": {"config.json": text}}, what="; ".join(done + [how])))
    return cases


HUGE = 10 ** 45


def config_vocabulary(model_type: str) -> list[str]:
    """What transformers lets a config of this type set: its class's __init__ parameters and the config base
    class's settable properties (num_labels builds a label map of that many entries). Read from the library."""
    import inspect

    from transformers import AutoConfig, PretrainedConfig

    cls = type(AutoConfig.for_model(model_type))
    names = [p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")]
    names += [n for n, v in inspect.getmembers(PretrainedConfig)
              if isinstance(v, property) and v.fset and not n.startswith("_")]
    return sorted(set(names))


def model_sweep_cases(rng: random.Random, n: int) -> list[Case]:
    """Every key of the vocabulary set to 10^45 (the number beyond every range), then to a seeded nasty value,
    on the tiny Llama: a boundary sweep, so no key the library reads goes untried."""
    base = json.loads((MODELS / "llama-tiny" / "config.json").read_text())
    cases = []
    for key in config_vocabulary(base["model_type"]):
        for value in (HUGE, rng.choice(NASTY_NUMBERS + NASTY_STRINGS[:4]))[: max(1, n)]:
            doc = {**base, key: value}
            text, _ = to_text(doc, random.Random(0))
            cases.append(Case("model-sweep", ["plan", "--model", "model", "--assume", "1xH100-80GB"],
                              dirs={"model": {"config.json": text}}, what=f"{key} = {value!r:.40}"))
    return cases


BASE_PLAN = ["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--main-process-ip", "10.0.0.1"]
NASTY_FLOAT_FLAG_VALUES = ("0", "-1", "1e-308", "5e-324", "1e308", "nan", "inf", "1e400", "0.5", "")


def flag_cases(rng: random.Random, n: int) -> list[Case]:
    """A boundary sweep of the numeric flags: every float and size flag with every float boundary (tiny, huge,
    not a number), and n more (flag, value) pairs of the other numeric flags with every nasty value, in a
    seeded order."""
    from wizard.config.questions import QUESTIONS

    numeric = [q for q in QUESTIONS if q.kind in ("int", "float", "count", "size") and q.flag]
    sweep = [(q.flag, v) for q in numeric if q.kind in ("float", "size") for v in NASTY_FLOAT_FLAG_VALUES]
    pairs = [(q.flag, v) for q in numeric if q.kind not in ("float", "size") for v in NASTY_FLAG_VALUES]
    rng.shuffle(pairs)
    return [Case("flags", [*BASE_PLAN, flag, value], what=f"{flag} {value!r:.40}")
            for flag, value in sweep + pairs[:n]]


def answers_cases(rng: random.Random, n: int) -> list[Case]:
    """An answers file of one to three questions, each with a nasty value; written with --non-interactive."""
    from wizard.config.questions import QUESTIONS

    keys = [q.id for q in QUESTIONS]
    cases = []
    for _ in range(n):
        doc = {rng.choice(keys): nasty_value(rng) for _ in range(rng.choice((1, 1, 2, 3)))}
        text, how = to_text(doc, rng)
        cases.append(Case("answers", ["--non-interactive", "--params", "125M", "--assume", "2xH100-80GB",
                                      "--answers", "a.yaml", "--output-dir", "out"],
                          {"a.yaml": text}, f"{doc!r:.80} {how}", writes_to="out"))
    return cases


PRICES = {"date": "2026-12-01", "currency": "USD", "prices": {"8xA100-80GB": 1.8, "H100-80GB": 2.5}}


def prices_cases(rng: random.Random, n: int) -> list[Case]:
    cases = []
    for _ in range(n):
        doc, done = mutate_doc(PRICES, rng)
        text, how = to_text(doc, rng)
        cases.append(Case("prices", ["compare", "--params", "125M", "--machines", "1xH100-80GB,8xA100-80GB",
                                     "--prices", "p.yaml"], {"p.yaml": text}, "; ".join(done + [how])))
    return cases


# run.json as the supervisor writes it: a finished run, and one that says it is running though its supervisor is gone
# (a pid above every kernel's pid_max: `runs` must tell its true state without writing anything)
NO_SUCH_PID = 1 << 22
FINISHED_RUN = {
    "id": "20261206-101500-ab12", "status": "succeeded", "supervisor_pid": NO_SUCH_PID,
    "supervisor_create_time": 1796000000.0, "run_dir": "RUN", "cwd": "/tmp", "script": "train.py",
    "script_args": ["--epochs", "1"], "command": ["accelerate", "launch", "train.py"],
    "config_file": "default_config.yaml", "ds_config": "ds_config.json", "launcher_pid": NO_SUCH_PID - 1,
    "pids": {"0": NO_SUCH_PID - 2, "1": NO_SUCH_PID - 3}, "tracked_pids": [NO_SUCH_PID - 2],
    "seen_pids": [NO_SUCH_PID - 2], "process_times": {str(NO_SUCH_PID - 2): 1796000001.0}, "attempt": 1,
    "max_restarts": 0, "user_restarts": 0, "started_at": 1796000000.0, "attempt_started_at": 1796000000.5,
    "ended_at": 1796000900.0, "exit_code": 0, "classification": {"kind": "ok", "summary": "finished",
                                                                    "log_tail": ["done"]},
    "stop_reason": None, "detached": False, "headless": True, "world_size": 2, "grace_s": 10.0,
    "stall_timeout_s": 600.0, "main_process_port": 29500,
    "progress": {"step": 10, "total": 10, "rate": 1.5, "eta_s": 0.0, "loss": 2.1, "learning_rate": 1e-4}}
ACTIVE_RUN = {**FINISHED_RUN, "status": "running", "ended_at": None, "exit_code": None, "classification": None}


def run_dir_cases(rng: random.Random, n: int) -> list[Case]:
    """A runs root of three run directories, one of them with a mutated run.json; `wizard runs` lists them all."""
    cases = []
    for _ in range(n):
        doc, done = mutate_doc(rng.choice((FINISHED_RUN, ACTIVE_RUN)), rng)
        text, how = to_text(doc, rng)
        events = '{"t": 1796000000.0, "kind": "start"}\n'
        dirs = {"runs/a-good": {"run.json": json.dumps(FINISHED_RUN), "events.jsonl": events},
                "runs/b-fuzzed": {"run.json": text, "events.jsonl": events},
                "runs/c-active": {"run.json": json.dumps(ACTIVE_RUN)}}
        argv = ["runs", "runs"] + (["--json"] if rng.random() < 0.3 else [])
        cases.append(Case("run-dir", argv, dirs=dirs, what="; ".join(done + [how])))
    return cases


KINDS: dict[str, Callable[[random.Random, int], list[Case]]] = {
    "ds-config": ds_config_cases, "accelerate-yaml": accelerate_yaml_cases, "training-args": training_args_cases,
    "model-config": model_config_cases, "model-sweep": model_sweep_cases, "flags": flag_cases, "answers": answers_cases, "prices": prices_cases,
    "run-dir": run_dir_cases,
}
