"""accelerate 1.16's FSDP2 parallelism config and fp8: asked where accelerate config asks them, offered only where
they run, written as accelerate writes them (under the names launch reads), and judged by accelerate's own classes
(ParallelismConfig._validate_accelerator, FP8BackendType, TERecipeKwargs) before a write."""

from __future__ import annotations

import pytest
import yaml

from tests.plans import make_plan
from wizard import pipeline
from wizard.config import answers, emit, fp8, parallelism
from wizard.config.questions import Context, by_id, check_precision_pair
from wizard.errors import InputError
from wizard.planning.plan import Plan, Rung, Topology
from wizard.probe import hardware
from wizard.probe.hardware import GPU, Hardware
from wizard.units import GiB

PRE_PLAN = ("model", "training", "strategy", "machines")


def _accelerate_version() -> tuple[int, int]:
    from importlib.metadata import version
    major, minor = version("accelerate").split(".")[:2]
    return int(major), int(minor)


# accelerate 1.16 removed MS-AMP (FP8BackendType has no MSAMP) and made ParallelismConfig refuse a tensor-parallel
# config that leaves FSDP no dimension to shard across; 1.13, the oldest supported, has MS-AMP and accepts it. The
# wizard's verdict is the installed accelerate's, so each end of the range is pinned to what it does.
ACCELERATE_1_16 = _accelerate_version() >= (1, 16)


def machine(n: int = 8, cc=(9, 0), name: str = "NVIDIA H100 80GB HBM3", source: str = "assume:8xH100-80GB"):
    return Hardware(gpus=[GPU(index=i, name=name, memory_total=80 * GiB, compute_capability=cc, bf16=True)
                          for i in range(n)], cpu_cores=64, ram_total=1024 * GiB, ram_available=900 * GiB,
                    source=source)


def fsdp_plan(world: int = 8, machines: int = 1) -> Plan:
    rung = Rung(key="fsdp2", name="FSDP2", backend="fsdp", fsdp_reshard=True, fits=True)
    return Plan(rungs=[rung], choice=rung, gpu_capacity_bytes=80 * GiB, usable_bytes=72 * GiB, precision="bf16",
                topology=Topology(machines, world // machines))


def details(given: dict, hw: Hardware | None = None, plan: Plan | None = None) -> dict:
    hw = hw or machine()
    pre = answers.resolve(PRE_PLAN, Context(hardware=hw), dict(given))
    ctx = Context(hardware=hw, plan=plan or fsdp_plan(), answers=pre, given=dict(given))
    return {**pre, **answers.resolve("details", ctx, dict(given))}


def build(given: dict, assume: str = "8xH100-80GB") -> pipeline.Result:
    return pipeline.build(pipeline.Request(given={"params": "7B", "backend": "fsdp", **given}, assume=assume,
                                           output_dir="/tmp/unused-wizard-out", calibrate=False))


# ----------------------------------------------------------------------------- the parallelism config: asked

def test_the_parallelism_config_is_asked_for_fsdp2_only_and_is_off_by_default():
    a = details({})
    assert a["use_parallelism_config"] is False
    assert not any(k.startswith("parallelism_config_") for k in a)
    assert "use_parallelism_config" not in details({"fsdp_version": 1})
    assert "use_parallelism_config" not in details({}, plan=make_plan("ddp", world=8))
    assert "use_parallelism_config" not in details({}, plan=make_plan("deepspeed", world=8, stage=3))


def test_turned_on_the_recommended_sizes_are_plain_sharding_over_every_process():
    a = details({"use_parallelism_config": "yes"})
    assert [a[k] for k in parallelism.SIZE_IDS] == [1, 8, 1, 1]
    assert parallelism.CP_COMM_ID not in a                      # asked only with cp > 1, as accelerate does


def test_a_given_size_turns_it_on_and_the_shard_size_takes_what_is_left():
    a = details({"parallelism_config_cp_size": "2"})
    assert a["use_parallelism_config"] is True
    assert [a[k] for k in parallelism.SIZE_IDS] == [1, 4, 1, 2]
    assert a[parallelism.CP_COMM_ID] == "allgather"
    a = details({"parallelism_config_dp_replicate_size": 2, "parallelism_config_tp_size": 2})
    assert [a[k] for k in parallelism.SIZE_IDS] == [2, 2, 2, 1]


def test_one_machine_keeps_accelerates_default_and_several_name_hsdp_without_choosing_it():
    ctx = Context(hardware=machine(), plan=fsdp_plan(), answers={"num_processes": 8, "fsdp_version": 2},
                  given={})
    q = by_id("use_parallelism_config")
    assert q.default(ctx) is False and "HSDP" not in q.why_default(ctx)
    two = Context(hardware=machine(), plan=fsdp_plan(16, 2), answers={"num_machines": 2, "num_processes": 16,
                                                                       "fsdp_version": 2}, given={})
    assert q.default(two) is False
    assert "HSDP, replicate 2 x shard 8" in q.why_default(two)
    assert "the plan sizes it as its HSDP rung" in q.why_default(two)      # issue 30: a rung of the ladder now
    assert "HSDP" in by_id("parallelism_config_dp_replicate_size").why_default(two)


def test_sizes_whose_product_is_not_the_process_count_are_refused_by_accelerates_own_class():
    # a context-parallel size is the plan's ladder (issue 38): one that cannot divide the processes is refused there,
    # in accelerate's terms, before the files
    with pytest.raises(InputError) as err:
        build({"parallelism_config_cp_size": "3"})
    assert err.value.field == "parallelism-config-cp-size"
    assert "3 does not divide the 8 processes" in str(err.value) and "ParallelismConfig" in str(err.value)
    if ACCELERATE_1_16:
        with pytest.raises(InputError) as err:
            build({"parallelism_config_tp_size": "8"})       # leaves FSDP nothing to shard across
        assert "no dimension for FSDP to shard across" in str(err.value)
    else:
        assert build({"parallelism_config_tp_size": "8"}).accelerate_doc["parallelism_config"][
            "parallelism_config_tp_size"] == 8
    with pytest.raises(InputError) as err:
        build({"parallelism_config_dp_replicate_size": "2", "parallelism_config_dp_shard_size": "1",
               "parallelism_config_cp_size": "4"})
    assert "pure data parallelism" in str(err.value)


def test_the_verdict_is_accelerates(monkeypatch):
    """parallelism.problem reports what ParallelismConfig._validate_accelerator raises, nothing of its own."""
    from accelerate.parallelism_config import ParallelismConfig

    calls = []
    real = ParallelismConfig._validate_accelerator

    def spy(self, accelerator):
        calls.append((self.total_size, accelerator.num_processes, accelerator.is_fsdp2))
        return real(self, accelerator)

    monkeypatch.setattr(ParallelismConfig, "_validate_accelerator", spy)
    assert parallelism.problem({"dp_shard_size": 4, "cp_size": 2}, 8) is None
    assert "only compatible" in parallelism.problem({"dp_shard_size": 4, "cp_size": 2}, 8, fsdp_version=1)
    assert calls == [(8, 8, True), (8, 8, False)]


def test_context_parallelism_needs_sdpa_attention():
    with pytest.raises(InputError) as err:
        details({"parallelism_config_cp_size": "2", "attention": "flash"})
    assert err.value.field == "parallelism-config-cp-size" and "SDPA" in str(err.value)
    assert details({"parallelism_config_cp_size": "2", "attention": "sdpa"})["parallelism_config_cp_size"] == 2


def test_the_parallelism_config_is_written_as_accelerate_config_writes_it():
    result = build({"parallelism_config_cp_size": "2", "parallelism_config_cp_comm_strategy": "alltoall"})
    assert result.accelerate_doc["parallelism_config"] == {
        "parallelism_config_dp_replicate_size": 1, "parallelism_config_dp_shard_size": 4,
        "parallelism_config_tp_size": 1, "parallelism_config_cp_size": 2,
        "parallelism_config_cp_comm_strategy": "alltoall"}
    # the size given is the plan's rung (issue 38: honoured, not "not modelled")
    assert result.plan.choice.key == "fsdp-cp2"
    assert any(n.startswith("context parallel 2:") for n in result.notes)
    assert not any("not model" in n for n in result.notes)
    assert "parallelism_config" not in build({}).accelerate_doc


def test_emit_refuses_a_parallelism_config_without_fsdp2():
    with pytest.raises(InputError):
        emit.accelerate_config({"use_parallelism_config": True}, make_plan("ddp", world=8), None)
    with pytest.raises(InputError):
        emit.accelerate_config({"use_parallelism_config": True, "fsdp_version": 1}, make_plan("fsdp", world=8),
                               None)


# ----------------------------------------------------------------------------- fp8: offered where it runs

def test_fp8_is_not_offered_below_compute_capability_8_9():
    a100 = machine(cc=(8, 0), name="NVIDIA A100-SXM4-80GB", source="assume:8xA100-80GB")
    ctx = Context(hardware=a100, plan=fsdp_plan(), answers={"fsdp_version": 2})
    q = by_id("mixed_precision")
    assert "fp8" not in q.options(ctx)
    with pytest.raises(InputError) as err:
        q.parse("fp8", ctx)
    assert "compute capability 8.9+" in str(err.value) and "has 8.0" in str(err.value)
    l4 = machine(1, cc=(8, 9), name="NVIDIA L4", source="assume:1xL4")
    assert "fp8" in q.options(Context(hardware=l4, plan=make_plan("single", world=1)))


def test_on_this_machine_fp8_needs_an_installed_backend(monkeypatch):
    here = machine(source="probe")
    ctx = Context(hardware=here, plan=fsdp_plan(), answers={"fsdp_version": 2})
    q, backend = by_id("mixed_precision"), by_id("fp8_backend")
    monkeypatch.setattr(fp8, "installed_fp8_backends", lambda: ())
    assert "fp8" not in q.options(ctx)
    with pytest.raises(InputError) as err:
        q.parse("fp8", ctx)
    assert "neither is installed" in str(err.value)
    monkeypatch.setattr(fp8, "installed_fp8_backends", lambda: ("te",))
    assert "fp8" in q.options(ctx)
    fp8_ctx = Context(hardware=here, plan=fsdp_plan(), answers={"mixed_precision": "fp8"})
    assert backend.options(fp8_ctx) == ("te",) and backend.default(fp8_ctx) == "te"
    with pytest.raises(InputError) as err:
        backend.parse("ao", fp8_ctx)
    assert "torchao (torchao) is not installed on this machine" in str(err.value)


def test_for_another_machine_both_backends_are_offered_and_ao_recommended(monkeypatch):
    monkeypatch.setattr(fp8, "installed_fp8_backends", lambda: ())     # nothing here: not the training machine
    ctx = Context(hardware=machine(), plan=fsdp_plan(), answers={"mixed_precision": "fp8"})
    assert by_id("fp8_backend").options(ctx) == ("ao", "te")
    assert by_id("fp8_backend").default(ctx) == "ao"


def test_installed_backends_are_found_without_importing_them():
    import sys

    found = fp8.installed_fp8_backends()
    assert set(found) <= {"ao", "te"}
    assert "torchao" not in sys.modules or "ao" in found
    assert "transformer_engine" not in sys.modules


def test_bf16_stays_recommended_and_the_why_says_what_fp8_changes():
    ctx = Context(hardware=machine(), plan=fsdp_plan(), answers={"fsdp_version": 2})
    q = by_id("mixed_precision")
    assert q.default(ctx) == "bf16"
    why = q.why_default(ctx)
    assert "fp8" in why and "hidden sizes" in why and "loss curve" in why


def test_fp8_pairs_with_bf16_precision_only():
    check_precision_pair("bf16", "fp8")
    with pytest.raises(InputError):
        check_precision_pair("fp16", "fp8")
    with pytest.raises(InputError):
        build({"precision": "fp16", "mixed_precision": "fp8"})


def test_fp8_through_torchao_turns_cpu_ram_efficient_loading_off_and_refuses_it_on():
    a = details({"mixed_precision": "fp8"})
    assert a["fp8_backend"] == "ao" and a["fsdp_cpu_ram_efficient_loading"] is False
    assert details({"mixed_precision": "fp8", "fp8_backend": "te"})["fsdp_cpu_ram_efficient_loading"] is True
    for given in ({}, {"fp8_backend": "ao"}):
        with pytest.raises(InputError) as err:
            details({"mixed_precision": "fp8", "fsdp_cpu_ram_efficient_loading": "yes", **given})
        assert err.value.field == "fsdp-cpu-ram-efficient-loading" and "torchao" in str(err.value)


def test_te_settings_are_asked_for_te_and_ao_settings_for_ao():
    te = details({"mixed_precision": "fp8", "fp8_backend": "te"})
    assert te["fp8_amax_compute_algo"] == "most_recent" and te["fp8_amax_history_len"] == 1024
    assert "fp8_override_fprop" not in te and "fp8_pad_inner_dim" not in te
    te = details({"mixed_precision": "fp8", "fp8_backend": "te", "fp8_override_linear_precision": "yes"})
    assert te["fp8_override_fprop"] is False
    ao = details({"mixed_precision": "fp8"})
    assert ao["fp8_pad_inner_dim"] is True and ao["fp8_enable_fsdp_float8_all_gather"] is True
    assert "fp8_margin" not in ao


def test_plain_configs_write_no_fp8_or_parallelism_section():
    for plan in (make_plan("single", world=1), make_plan("ddp", world=8), make_plan("fsdp", world=8)):
        doc = emit.accelerate_config({}, plan, None)
        assert "fp8_config" not in doc and "parallelism_config" not in doc


def test_the_fp8_config_is_written_under_the_names_launch_reads():
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te", "fp8_amax_history_len": 16,
                                  "fp8_amax_compute_algo": "max", "fp8_override_linear_precision": True,
                                  "fp8_override_wgrad": True}, make_plan("ddp", world=8), None)
    assert doc["fp8_config"] == {"backend": "TE", "use_autocast_during_eval": False, "margin": 0, "interval": 1,
                                 "fp8_format": "HYBRID", "amax_history_len": 16, "amax_compute_algo": "max",
                                 "override_linear_precision": [False, False, True]}
    ao = emit.accelerate_config({"mixed_precision": "fp8"}, make_plan("single", world=1), None)["fp8_config"]
    assert ao == {"backend": "AO", "enable_fsdp_float8_all_gather": True, "pad_inner_dim": True}


# ----------------------------------------------------------------------------- validation before a write

def write_yaml(tmp_path, doc: dict) -> str:
    path = tmp_path / "default_config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def launch(tmp_path, doc: dict):
    from wizard.config.validate import accelerate_launch
    return accelerate_launch(write_yaml(tmp_path, doc), planned_gpus=True)


def test_launch_reads_every_fp8_value_the_wizard_writes(tmp_path):
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te", "fp8_amax_history_len": 16,
                                  "fp8_amax_compute_algo": "max", "fp8_margin": 2, "fp8_format": "E4M3",
                                  "fp8_override_linear_precision": True, "fp8_override_dgrad": True},
                                 make_plan("ddp", world=8), None)
    out = launch(tmp_path, doc)
    assert out.error is None, out.error
    env = out.env
    keys = ("BACKEND", "AMAX_HISTORY_LEN", "AMAX_COMPUTE_ALGO", "MARGIN", "FORMAT")
    assert [env[f"ACCELERATE_FP8_{k}"] for k in keys] == ["TE", "16", "max", "2", "E4M3"]
    assert (env["ACCELERATE_FP8_OVERRIDE_FPROP"], env["ACCELERATE_FP8_OVERRIDE_DGRAD"]) == ("False", "True")


def test_accelerate_configs_own_amax_keys_never_reach_the_recipe(tmp_path):
    """Why the wizard renames them: what accelerate config writes for TE's history and algorithm is exported under
    names TERecipeKwargs never reads, so launch hands it the defaults (1024, most_recent)."""
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te"}, make_plan("ddp", world=8), None)
    fp8_section = doc["fp8_config"]
    fp8_section.pop("amax_history_len")
    fp8_section.pop("amax_compute_algo")
    fp8_section.update(amax_history_length=16, amax_compute_algorithm="max")
    env = launch(tmp_path, doc).env
    assert env["ACCELERATE_FP8_AMAX_HISTORY_LEN"] == "1024" and env["ACCELERATE_FP8_AMAX_COMPUTE_ALGO"] == "most_recent"
    assert env["ACCELERATE_FP8_AMAX_HISTORY_LENGTH"] == "16"       # exported, and read by nothing


def test_ms_amp_is_refused_with_accelerates_enum(tmp_path):
    doc = emit.accelerate_config({"mixed_precision": "fp8"}, make_plan("ddp", world=8), None)
    doc["fp8_config"] = {"backend": "MSAMP", "opt_level": "O2"}
    out = launch(tmp_path, doc)
    if not ACCELERATE_1_16:
        assert out.error is None, out.error           # still one of 1.13's backends
        return
    assert out.stage == "prepare" and "'MSAMP' is not a valid FP8BackendType" in out.error
    assert "MS-AMP was removed" in out.error


def test_a_bad_te_value_is_refused_by_te_recipe_kwargs(tmp_path):
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te"}, make_plan("ddp", world=8), None)
    doc["fp8_config"]["amax_compute_algo"] = "mean"
    out = launch(tmp_path, doc)
    assert out.stage == "prepare" and "amax_compute_algo" in out.error


def test_fp8_validation_on_a_machine_without_a_backend_restores_accelerate(tmp_path):
    import accelerate.utils.dataclasses as dc
    import accelerate.utils.launch as launch_utils

    before = (launch_utils.is_fp8_available, dc.is_transformer_engine_available)
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te"}, make_plan("single", world=1), None)
    assert launch(tmp_path, doc).error is None
    assert (launch_utils.is_fp8_available, dc.is_transformer_engine_available) == before


@pytest.mark.parametrize("sizes,message", [
    ((1, 4, 1, 2), None),
    ((2, 4, 1, 1), None),
    ((1, 3, 1, 1), "total_size (3) does not match num_processes (8)"),
    ((1, 1, 8, 1), "no dimension for FSDP to shard across"),
])
def test_the_launch_environment_is_judged_by_parallelism_config(tmp_path, sizes, message):
    answers_ = {"use_parallelism_config": True,
                **{key: size for key, size in zip(parallelism.SIZE_IDS, sizes)}}
    doc = emit.accelerate_config(answers_, make_plan("fsdp", world=8), None)
    out = launch(tmp_path, doc)
    if message is not None and "no dimension" in message and not ACCELERATE_1_16:
        message = None
    if message is None:
        assert out.error is None, out.error
        assert out.env["ACCELERATE_USE_PARALLELISM_CONFIG"] == "true"
    else:
        assert out.stage == "prepare" and message in out.error


def test_a_parallelism_config_beside_fsdp1_passes_launch_but_not_the_accelerator(tmp_path):
    doc = emit.accelerate_config({"fsdp_version": 1}, make_plan("fsdp", world=8), None)
    doc["parallelism_config"] = {"parallelism_config_dp_shard_size": 4, "parallelism_config_cp_size": 2}
    out = launch(tmp_path, doc)
    assert out.stage == "prepare" and "FSDP (version 2)" in out.error


def test_the_wizard_writes_a_checked_fp8_and_parallelism_config_for_h100s(tmp_path):
    result = pipeline.build(pipeline.Request(
        given={"params": "7B", "backend": "fsdp", "mixed_precision": "fp8", "parallelism_config_tp_size": "2"},
        assume="8xH100-80GB", output_dir=str(tmp_path), calibrate=False))
    pipeline.validate(result)
    assert not result.errors, [f.message for f in result.errors]
    assert result.accelerate_doc["fp8_config"]["backend"] == "AO"
    assert result.accelerate_doc["parallelism_config"]["parallelism_config_dp_shard_size"] == 4
    assert hardware.assume("8xH100-80GB").source != "probe"


# ----------------------------------------------------------------------------- wizard check

def check(tmp_path, doc: dict, assume: str = "8xH100-80GB", backends=("ao", "te")) -> list:
    from wizard.check.doctor import build_context, run_rules

    ctx = build_context(config_file=write_yaml(tmp_path, doc), hardware=hardware.assume(assume), versions={},
                        use_default_config=False, port_in_use=lambda port: False, memlock_limit=lambda: None)
    ctx.fp8_backends = tuple(backends)
    return run_rules(ctx)


def test_accelerate_configs_own_unread_fp8_keys_are_named_with_the_name_launch_reads(tmp_path):
    doc = emit.accelerate_config({"mixed_precision": "fp8", "fp8_backend": "te"}, make_plan("ddp", world=8), None)
    assert not check(tmp_path, doc)                      # what the wizard writes: nothing to say
    section = doc["fp8_config"]
    section["amax_history_length"] = section.pop("amax_history_len")
    section["amax_compute_algorithm"] = section.pop("amax_compute_algo")
    found = {f.key: f for f in check(tmp_path, doc)}
    assert set(found) == {"fp8_config.amax_history_length", "fp8_config.amax_compute_algorithm"}
    assert all(f.rule == "ACC-UNKNOWN-NESTED-KEY" and f.severity == "warning" for f in found.values())
    assert found["fp8_config.amax_history_length"].fix == "rename it to amax_history_len"


def test_ms_amp_and_a_bad_parallelism_config_are_accelerates_own_rejections(tmp_path):
    doc = emit.accelerate_config({"mixed_precision": "fp8"}, make_plan("ddp", world=8), None)
    doc["fp8_config"] = {"backend": "MSAMP", "opt_level": "O2"}
    found = {(f.rule, f.key) for f in check(tmp_path, doc)}
    if ACCELERATE_1_16:
        assert ("ACC-LAUNCH-REJECTS", None) in found and ("ACC-UNKNOWN-NESTED-KEY", "fp8_config.opt_level") in found
    else:
        assert not found                                  # MS-AMP and its opt_level are 1.13's own
    doc = emit.accelerate_config({"use_parallelism_config": True, "parallelism_config_dp_shard_size": 3},
                                 make_plan("fsdp", world=8), None)
    found = [f for f in check(tmp_path, doc) if f.severity == "error"]
    assert [f.rule for f in found] == ["ACC-LAUNCH-REJECTS"] and "total_size (3)" in found[0].message


def test_the_wizards_fsdp2_parallelism_config_passes_check(tmp_path):
    doc = emit.accelerate_config({"use_parallelism_config": True, "parallelism_config_dp_shard_size": 4,
                                  "parallelism_config_tp_size": 2}, make_plan("fsdp", world=8), None)
    assert not [f for f in check(tmp_path, doc) if f.severity != "info"]


def test_the_torchao_ram_efficient_loading_refusal_is_accelerates():
    """ACC-FP8-AO-RAM-EFFICIENT-LOADING and the table's refusal quote the installed Accelerator (torchao is not
    installed here, so the Accelerator itself cannot be built: its source says it)."""
    import inspect

    from accelerate import Accelerator

    source = inspect.getsource(Accelerator.__init__)
    assert "torchao with FSDP2 and cpu_ram_efficient_loading is not supported" in source
    assert "self.fp8_backend == FP8BackendType.AO" in source and "cpu_ram_efficient_loading" in source


@pytest.mark.parametrize("given,culprit", [({"fsdp_version": "1"}, "--fsdp-version"),
                                           ({"use_parallelism_config": "no"}, "--use-parallelism-config")])
def test_a_size_beside_an_answer_that_rules_the_config_out_is_a_conflict(given, culprit):
    with pytest.raises(InputError) as err:
        build({"parallelism_config_cp_size": "2", **given})
    assert err.value.field == "parallelism-config-cp-size" and culprit in str(err.value)


def test_a_size_given_is_honoured_even_where_the_plan_would_choose_another_backend():
    """Issue 38: --parallelism-config-cp-size 2 on a 1B model (ZeRO-2 fits) was written but "not used by this
    plan"; the plan is now the context-parallel rung of that size, and its files carry it."""
    result = pipeline.build(pipeline.Request(given={"params": "1B", "parallelism_config_cp_size": "2"},
                                             assume="8xH100-80GB", output_dir="/tmp/unused-wizard-out",
                                             calibrate=False))
    assert result.plan.choice.key == "fsdp-cp2" and [r.key for r in result.plan.rungs] == ["fsdp-cp2"]
    assert not any("--parallelism-config-cp-size" in note for note in result.plan.notes)
    assert result.accelerate_doc["parallelism_config"]["parallelism_config_cp_size"] == 2
    with pytest.raises(InputError) as err:
        build({"mixed_precision": "fp8", "backend": "deepspeed"})
    assert "--backend" in str(err.value)


def test_the_trainer_keeps_fp8_only_without_bf16_and_the_snippet_leaves_it_out(monkeypatch):
    """TrainingArguments.__post_init__ takes launch's ACCELERATE_MIXED_PRECISION unless bf16/fp16 replace it: the
    TrainingArguments the wizard prints for an fp8 config set neither (TRN-PRECISION-OVERRIDES-FP8 is the check)."""
    from transformers import TrainingArguments

    from wizard.frontends.snippets import training_arguments

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    assert TrainingArguments(output_dir="out", report_to=[]).mixed_precision == "fp8"
    assert TrainingArguments(output_dir="out", report_to=[], bf16=True, use_cpu=True).mixed_precision == "bf16"
    kwargs = training_arguments({"mixed_precision": "fp8"}, make_plan("ddp", world=8), None)
    assert "bf16" not in kwargs and "fp16" not in kwargs
    assert training_arguments({"mixed_precision": "bf16"}, make_plan("ddp", world=8), None)["bf16"] is True
