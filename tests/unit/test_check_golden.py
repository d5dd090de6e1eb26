"""`wizard check` on the golden configs the wizard writes (snapshots/golden/*/): each is clean, and each single
mutation from the rule list makes exactly the expected rule fire (compared with the unmutated golden).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Callable

import pytest
import yaml

from wizard.check.doctor import build_context, run_rules
from wizard.check.rules.methods import method_options
from wizard.probe.hardware import assume, load_file

ROOT = Path(__file__).resolve().parent.parent.parent
GOLDEN = ROOT / "snapshots" / "golden"
FIX = ROOT / "tests" / "fixtures"
GOLDENS = sorted(p.parent for p in GOLDEN.glob("*/default_config.yaml"))

# Findings a golden is known to carry, with why; for the lead to decide (see the report of issue 5).
KNOWN: dict[str, set[str]] = {}  # golden configs are clean: wizard check reports nothing on them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _opt(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


class GoldenFiles:
    """A golden case as stored: its wizard arguments and config files, read where they are."""

    def __init__(self, directory: Path):
        self.name = directory.name
        self.args = [a.replace("<FIX>", str(FIX)) for a in json.loads((directory / "args.json").read_text())]
        self.dir = directory

    @property
    def acc(self) -> Path:
        return self.dir / "default_config.yaml"

    @property
    def ds(self) -> Path:
        return self.dir / "ds_config.json"


class Golden(GoldenFiles):
    """A writable copy of a golden case, paths and port filled in, that the rules can check."""

    def __init__(self, directory: Path, tmp: Path):
        super().__init__(directory)
        self.dir = tmp / "out"
        self.dir.mkdir(parents=True)
        nvme = tmp / "nvme"
        nvme.mkdir()
        port = str(_free_port())
        for f in ("default_config.yaml", "ds_config.json"):
            if (directory / f).exists():
                text = (directory / f).read_text().replace("<OUTPUT_DIR>", str(self.dir)).replace("<NVME>", str(nvme))
                # a port in use by another job on this machine is not what these tests are about
                text = text.replace("main_process_port: 29500", f"main_process_port: {port}")
                (self.dir / f).write_text(text)

    def findings(self):
        hw = load_file(_opt(self.args, "--hardware")) if "--hardware" in self.args else assume(_opt(self.args, "--assume"))
        model = _opt(self.args, "--model")
        ctx = build_context(config_file=str(self.acc), hardware=hw, model=model,
                            trainer=_opt(self.args, "--trainer") or "hf",
                            seq_len=int(_opt(self.args, "--seq-len") or 2048), use_default_config=False,
                            method=method_options(_opt(self.args, "--method") or "full",
                                                  _opt(self.args, "--lora-rank") or 16, _opt(self.args, "--lora-targets")))
        if "--params" in self.args:
            from wizard.sizing.model import from_params
            ctx.model, ctx.model_id = from_params(_opt(self.args, "--params")), "--params " + _opt(self.args, "--params")
        return run_rules(ctx)


def _needs_goldens():
    if not GOLDENS:
        pytest.skip("no golden configs in snapshots/golden yet (run python tests/regen_golden.py)")


@pytest.mark.parametrize("directory", GOLDENS, ids=[p.name for p in GOLDENS])
def test_golden_is_clean(directory, tmp_path):
    findings = Golden(directory, tmp_path).findings()
    got = {f.rule for f in findings}
    assert not [f for f in findings if f.severity == "error"], [f"{f.rule} {f.key}: {f.message}" for f in findings]
    assert got == KNOWN.get(directory.name, set()), [f"{f.rule} {f.key}: {f.message}" for f in findings]


def test_goldens_exist_or_skip():
    _needs_goldens()
    assert len(GOLDENS) >= 5


# ----------------------------------------------------------------------------- mutations


def _yaml(g: GoldenFiles) -> dict:
    return yaml.safe_load(g.acc.read_text())


def _write_yaml(g: Golden, data: dict) -> None:
    g.acc.write_text(yaml.safe_dump(data, sort_keys=True))


def _ds(g: GoldenFiles) -> dict | None:
    return json.loads(g.ds.read_text()) if g.ds.exists() else None


def _write_ds(g: Golden, data: dict) -> None:
    g.ds.write_text(json.dumps(data, indent=2) + "\n")


def _is(dtype: str) -> Callable[[GoldenFiles], bool]:
    return lambda g: _yaml(g).get("distributed_type") == dtype


def _stage(*stages: int) -> Callable[[GoldenFiles], bool]:
    return lambda g: _ds(g) is not None and _ds(g).get("zero_optimization", {}).get("stage") in stages


def _edit_yaml(fn):
    def apply(g: Golden):
        data = _yaml(g)
        fn(data)
        _write_yaml(g, data)
    return apply


def _edit_ds(fn):
    def apply(g: Golden):
        data = _ds(g)
        fn(data)
        _write_ds(g, data)
    return apply


def _replace_text(path_attr: str, old: str, new: str):
    def apply(g: Golden):
        p = getattr(g, path_attr)
        assert old in p.read_text()
        p.write_text(p.read_text().replace(old, new, 1))
    return apply


def _gpu_list(d: dict) -> None:
    d["gpu_ids"] = list(range(max(1, d["num_processes"] // d.get("num_machines", 1))))


def _zero(fn):
    return _edit_ds(lambda d: fn(d["zero_optimization"]))


# name -> (applies to this golden?, mutation, expected rule)
MUTATIONS: dict[str, tuple[Callable[[GoldenFiles], bool], Callable[[Golden], None], str]] = {
    "unquote-NO": (lambda g: "distributed_type: 'NO'" in g.acc.read_text(),
                   _replace_text("acc", "distributed_type: 'NO'", "distributed_type: NO"), "ACC-UNQUOTED-NO"),
    "mixed-precision-no": (lambda g: "mixed_precision: bf16" in g.acc.read_text(),
                           _replace_text("acc", "mixed_precision: bf16", "mixed_precision: no"), "ACC-UNQUOTED-NO"),
    "gpu-ids-list": (lambda g: _yaml(g).get("use_cpu") is not True, _edit_yaml(_gpu_list), "ACC-GPU-IDS-NOT-STRING"),
    "unknown-top-key": (lambda g: True, _edit_yaml(lambda d: d.update(num_gpus=4)), "ACC-UNKNOWN-KEY"),
    "nested-unknown-ds": (_is("DEEPSPEED"),
                          _edit_yaml(lambda d: d["deepspeed_config"].update(train_micro_batch_size_per_gpu=4)),
                          "ACC-UNKNOWN-NESTED-KEY"),
    "nested-unknown-fsdp": (_is("FSDP"), _edit_yaml(lambda d: d["fsdp_config"].update(fsdp_bogus=1)),
                            "ACC-UNKNOWN-NESTED-KEY"),
    "mixed-precision-beside-ds-file": (_is("DEEPSPEED"), _edit_yaml(lambda d: d.update(mixed_precision="bf16")),
                                       "ACC-KEYS-BESIDE-DS-FILE"),
    "zero-stage-beside-ds-file": (_is("DEEPSPEED"), _edit_yaml(lambda d: d["deepspeed_config"].update(zero_stage=3)),
                                  "ACC-KEYS-BESIDE-DS-FILE"),
    "rdzv-c10d": (lambda g: _yaml(g).get("num_machines", 1) == 1,
                  _edit_yaml(lambda d: d.update(rdzv_backend="c10d")), "ACC-IGNORED-BY-LAUNCH"),
    "per-node-count": (lambda g: _yaml(g).get("num_machines", 1) > 1,
                       _edit_yaml(lambda d: d.update(num_processes=d["num_processes"] // d["num_machines"])),
                       "ACC-NUM-PROCESSES-PER-NODE"),
    "too-many-processes": (lambda g: "--assume" in g.args and _yaml(g).get("num_machines", 1) == 1
                           and _yaml(g).get("distributed_type") != "NO",
                           _edit_yaml(lambda d: d.update(num_processes=d["num_processes"] * 2)),
                           "ACC-NUM-PROCESSES-EXCEEDS-GPUS"),
    "fsdp-beside-deepspeed": (_is("DEEPSPEED"), _edit_yaml(lambda d: d.update(fsdp_config={"fsdp_version": 2})),
                              "INT-FSDP-AND-DEEPSPEED"),
    "bad-distributed-type": (lambda g: True, _edit_yaml(lambda d: d.update(distributed_type="MULTIGPU")),
                             "ACC-LOADER-REJECTS"),
    "stage-auto": (_stage(1, 2, 3), _zero(lambda z: z.update(stage="auto")), "DS-AUTO-IN-SUBCONFIG"),
    "sub-group-auto": (_stage(1, 2, 3), _zero(lambda z: z.update(sub_group_size="auto")), "DS-AUTO-UNFILLED"),
    "float-prefetch": (_stage(3), _zero(lambda z: z.update(stage3_prefetch_bucket_size=15099494.4)),
                       "DS-FLOAT-BUCKET"),
    "odd-allgather": (_stage(1, 2), _zero(lambda z: z.update(allgather_bucket_size=500000001)),
                      "DS-ODD-ALLGATHER-BUCKET"),
    "aio-in-zero": (_stage(1, 2, 3), _zero(lambda z: z.update(aio={"block_size": 1048576})), "DS-AIO-IN-ZERO"),
    "no-gather-on-save": (_stage(3), _zero(lambda z: z.pop("stage3_gather_16bit_weights_on_model_save")),
                          "DS-ZERO3-NO-16BIT-SAVE"),
    "torch-optimizer-on-offload": (lambda g: _ds(g) is not None and "--optimizer" not in g.args
                                   and (_ds(g).get("zero_optimization") or {}).get("offload_optimizer"),
                                   _edit_ds(lambda d: (d.pop("optimizer", None),
                                                       d.update(zero_force_ds_cpu_optimizer=False))),
                                   "DS-OFFLOAD-TORCH-OPTIMIZER"),
    "top-level-typo": (_stage(0, 1, 2, 3), _edit_ds(lambda d: d.update(train_micro_batch_size=4)),
                       "DS-UNKNOWN-TOP-KEY"),
    "duplicate-key": (_stage(0, 1, 2, 3), _replace_text("ds", '"zero_optimization": {',
                                                        '"gradient_clipping": 1.0,\n  "zero_optimization": {'),
                      "DS-DUPLICATE-KEY"),
    "no-zero-section": (_stage(1, 2, 3), _edit_ds(lambda d: d.pop("zero_optimization")), "DS-NO-ZERO-OPTIMIZATION"),
    "nvme-without-path": (_stage(3), _zero(lambda z: z.update(offload_param={"device": "nvme"})), "DS-NVME-NO-PATH"),
}


def _cases():
    """Only the (golden, mutation) pairs where the mutation applies: the rest could never run."""
    if not GOLDENS:
        return [pytest.param(None, None, marks=pytest.mark.skip(reason="no golden configs in snapshots/golden yet"))]
    stored = [GoldenFiles(d) for d in GOLDENS]
    return [pytest.param(g.dir, name, id=f"{g.name}:{name}")
            for g in stored for name, (applies, _, _) in MUTATIONS.items() if applies(g)]


def _keyset(findings):
    return {(f.rule, f.key) for f in findings}


@pytest.mark.parametrize("directory,mutation", _cases())
def test_single_mutation_fires_exactly_its_rule(directory, mutation, tmp_path):
    golden = Golden(directory, tmp_path)
    applies, mutate, expected = MUTATIONS[mutation]
    assert applies(golden), f"{mutation} applies to the stored {directory.name} but not to its filled-in copy"
    before = _keyset(golden.findings())
    mutate(golden)
    after = golden.findings()
    new = {rule for rule, key in _keyset(after) - before}
    assert new == {expected}, [f"{f.rule} {f.key}: {f.message}" for f in after]


def test_every_mutation_applies_to_some_golden():
    _needs_goldens()
    stored = [GoldenFiles(d) for d in GOLDENS]
    unused = [name for name, (applies, _, _) in MUTATIONS.items() if not any(applies(g) for g in stored)]
    assert not unused, f"mutations that no golden exercises: {unused}"
