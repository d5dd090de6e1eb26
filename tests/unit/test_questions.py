"""The question table: completeness, conditions (mirroring accelerate config), defaults and validation."""

from __future__ import annotations

import pytest

from wizard.config import answers
from wizard.config.questions import (
    DETAIL_GROUPS,
    KINDS,
    QUESTIONS,
    STAGES,
    Context,
    by_id,
    first_slurm_host,
    for_stage,
    is_valid_host,
)
from wizard.errors import InputError
from wizard.planning.plan import Plan, Rung, Topology
from wizard.probe.hardware import GPU, Hardware
from wizard.sizing.model import ModelShape
from wizard.units import GiB

PRE_PLAN = ("model", "training", "strategy", "machines")


# ----------------------------------------------------------------------------- builders

def gpus(n: int, name: str = "NVIDIA H100 80GB HBM3", mem: int = 80, cc=(9, 0)) -> Hardware:
    return Hardware(gpus=[GPU(index=i, name=name, memory_total=mem * GiB, compute_capability=cc, bf16=cc[0] >= 8)
                          for i in range(n)], cpu_cores=32, ram_total=512 * GiB, ram_available=500 * GiB)


def h100s_elsewhere(n: int = 8) -> Hardware:
    """H100s planned from another machine (--assume): the fp8 backends installed there are not known here."""
    hw = gpus(n)
    hw.source = f"assume:{n}xH100-80GB"
    return hw


def no_gpu() -> Hardware:
    return Hardware(gpus=[], gpu_reason="NVML Shared Library Not Found", cpu_cores=2, ram_total=8 * GiB,
                    ram_available=6 * GiB)


LLAMA = ModelShape(params=6_738_415_616, largest_layer_params=131_072_000, hidden_size=4096, layers=32,
                   heads=32, kv_heads=32, vocab_size=32000, intermediate_size=11008,
                   layer_class="LlamaDecoderLayer", model_type="llama")


def plan(backend: str, zero_stage: int | None = None, *, precision: str = "bf16", processes: int = 8,
         machines: int = 1, cpu: bool = False, gc: bool = False, offload: str = "none",
         reshard: bool | None = None) -> Plan:
    rung = Rung(key=backend, name=backend, backend=backend, zero_stage=zero_stage, offload_optimizer=offload,
                offload_param=offload, fsdp_reshard=reshard, gradient_checkpointing=gc, fits=True)
    return Plan(rungs=[rung], choice=rung, gpu_capacity_bytes=80 * GiB, usable_bytes=72 * GiB,
                precision=precision, topology=Topology(machines, processes // machines, cpu))


def pre(hw: Hardware, given: dict | None = None) -> dict:
    return answers.resolve(PRE_PLAN, Context(hardware=hw), dict(given or {}))


def details(hw: Hardware, p: Plan, given: dict | None = None, pre_given: dict | None = None,
            model: ModelShape | None = LLAMA) -> dict:
    a = pre(hw, pre_given)
    return answers.resolve("details", Context(hardware=hw, model=model, plan=p, answers=a), dict(given or {}))


def error(fn, *args, **kw) -> InputError:
    with pytest.raises(InputError) as info:
        fn(*args, **kw)
    e = info.value
    assert "\n" not in str(e), "messages are one line"
    return e


# ----------------------------------------------------------------------------- the table itself

def test_ids_and_flags_are_unique_and_follow_the_ids():
    ids = [q.id for q in QUESTIONS]
    assert len(ids) == len(set(ids))
    flags = [q.flag for q in QUESTIONS if q.flag]
    assert len(flags) == len(set(flags))
    for q in QUESTIONS:
        assert q.flag == "--" + q.id.replace("_", "-")
        assert by_id(q.id) is q


def test_contract_ids_are_all_present():
    contract = """model params hidden_size layers heads vocab_size seq_len micro_batch grad_accum precision
    gradient_checkpointing optimizer attention trainer backend zero_stage offload nvme_path headroom
    num_processes gpu_ids num_machines machine_rank main_process_ip main_process_port same_network rdzv_backend
    use_cpu debug enable_cpu_affinity deepspeed_multinode_launcher deepspeed_hostfile zero3_init_flag
    zero3_save_16bit_model gradient_clipping deepspeed_moe_layer_cls_names fsdp_version
    fsdp_reshard_after_forward fsdp_offload_params fsdp_auto_wrap_policy fsdp_transformer_layer_cls_to_wrap
    fsdp_min_num_params fsdp_state_dict_type fsdp_cpu_ram_efficient_loading fsdp_activation_checkpointing
    use_dynamo dynamo_backend dynamo_mode dynamo_use_fullgraph dynamo_use_dynamic
    dynamo_use_regional_compilation mixed_precision""".split()
    missing = [i for i in contract if i not in {q.id for q in QUESTIONS}]
    assert not missing


def test_every_question_is_described():
    for q in QUESTIONS:
        assert q.prompt.strip(), q.id
        assert len(q.help) >= 40 and q.help.rstrip().endswith((".", ")")), q.id
        assert q.help.count(". ") <= 3, f"{q.id}: help is 1-3 sentences"
        assert q.kind in KINDS, q.id
        assert q.stage in STAGES, q.id
        if q.stage == "details":
            assert q.group in DETAIL_GROUPS, q.id
        else:
            assert q.group == q.stage, q.id
        if q.kind == "choice":
            assert q.choices, q.id


def test_questions_come_in_stage_order():
    order = [STAGES.index(q.stage) for q in QUESTIONS]
    assert order == sorted(order)
    assert [q.id for q in for_stage("machines")][:1] == ["num_machines"]


# Contexts in which every question is asked at least once, with its default and why.
def _contexts():
    multi = {"num_machines": 2, "main_process_ip": "10.0.0.1", "same_network": False, "use_dynamo": True,
             "dynamo_customize": True,
             "deepspeed_multinode_launcher": "pdsh"}
    yield Context(hardware=gpus(8), model=LLAMA, plan=plan("deepspeed", 3, processes=16, machines=2)), multi
    yield Context(hardware=gpus(8), model=LLAMA, plan=plan("fsdp", reshard=True)), \
        {"fsdp_version": 1, "fsdp_cpu_ram_efficient_loading": False}
    yield Context(hardware=gpus(8), model=LLAMA, plan=plan("ddp")), {}
    yield Context(hardware=gpus(8), model=LLAMA, plan=plan("fsdp")), {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}
    yield Context(hardware=gpus(8), model=LLAMA, plan=plan("fsdp")), {}
    yield Context(hardware=no_gpu(), model=LLAMA, plan=plan("ddp", precision="fp32", processes=2, cpu=True)), \
        {"backend": "ddp", "num_processes": 2}
    yield Context(hardware=gpus(1), model=None, plan=None), {"params": "7B"}
    yield Context(hardware=gpus(1), model=None, plan=None), {"params": "7B", "dataset_tokens": "1e9"}
    yield Context(hardware=gpus(1), model=None, plan=None), {"params": "7B", "method": "lora"}
    # fp8 (H100s planned from elsewhere: both backends offered) and FSDP2's parallelism config
    yield Context(hardware=h100s_elsewhere(), model=LLAMA, plan=plan("fsdp")), \
        {"parallelism_config_cp_size": 2, "mixed_precision": "fp8", "fp8_backend": "te",
         "fp8_override_linear_precision": True}
    yield Context(hardware=h100s_elsewhere(), model=LLAMA, plan=plan("fsdp")), {"mixed_precision": "fp8"}


def _asked_everywhere():
    seen: dict[str, list] = {}
    for ctx, given in _contexts():
        pre_a = answers.resolve(PRE_PLAN, Context(hardware=ctx.hardware), given)
        full = Context(hardware=ctx.hardware, model=ctx.model, plan=ctx.plan, answers=pre_a, given=given)
        det = answers.resolve("details", full, given) if ctx.plan else {}
        final = Context(hardware=ctx.hardware, model=ctx.model, plan=ctx.plan, answers={**pre_a, **det},
                        given=given)
        for q in QUESTIONS:
            if q.id in pre_a or q.id in det:
                seen.setdefault(q.id, []).append((q, final))
    return seen


# --use-mpirun is refused (the wizard does not write accelerate's mpirun_config), so its hostfile is never asked.
NEVER_ASKED = {"mpirun_hostfile"}


def test_every_question_is_asked_somewhere_and_explains_its_default():
    seen = _asked_everywhere()
    assert set(seen) == {q.id for q in QUESTIONS} - NEVER_ASKED, "some question is never asked"
    for qid, cases in seen.items():
        for q, ctx in cases:
            assert q.why_default(ctx).strip(), qid


# A question with no default (None) must be conditional or be an optional input the pipeline checks.
OPTIONAL_INPUTS = {"model", "params", "hidden_size", "layers", "heads", "vocab_size", "nvme_path",
                   "main_process_ip", "deepspeed_moe_layer_cls_names", "deepspeed_exclusion_filter",
                   "deepspeed_inclusion_filter", "fsdp_transformer_layer_cls_to_wrap",
                   "global_batch", "train_tokens", "dataset_tokens", "epochs", "lora_alpha", "lora_targets",
                   "inter_node_gbps", "save_total_limit"}


def test_every_question_has_a_default_or_is_conditional_or_optional():
    base = Context(hardware=gpus(1), answers=pre(gpus(1)))
    for qid, cases in _asked_everywhere().items():
        q = cases[0][0]
        has_default = any(q.default(ctx) is not None for _, ctx in cases)
        assert has_default or qid in OPTIONAL_INPUTS, qid
        # None is a real answer for these ("not set"), never a required value in a plain set-up.
        if qid in OPTIONAL_INPUTS:
            assert q.required(base) is None, qid
    # the two that can become required do so only under their condition
    multi = Context(hardware=gpus(1), answers={"num_machines": 2})
    assert by_id("main_process_ip").required(multi) and not by_id("main_process_ip").ask_if(base)
    assert by_id("nvme_path").required(Context(hardware=gpus(1), answers={"offload": "nvme"}))


# ----------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("raw,expected", [
    ("yes", True), ("No", False), ("TRUE", True), ("false", False), ("on", True), ("off", False),
    ("1", True), ("0", False), (True, True), (0, False)])
def test_bools_accept_the_usual_spellings(raw, expected):
    assert by_id("use_dynamo").parse(raw, Context(hardware=gpus(1))) is expected


def test_bool_rejects_other_words():
    e = error(by_id("use_dynamo").parse, "maybe", Context(hardware=gpus(1)))
    assert e.field == "use-dynamo" and "yes" in e.allowed


def test_choices_are_case_insensitive_with_canonical_output():
    ctx = Context(hardware=gpus(1))
    assert by_id("precision").parse("BF16", ctx) == "bf16"
    assert by_id("backend").parse(" DeepSpeed ", ctx) == "deepspeed"
    assert by_id("dynamo_backend").parse("inductor", ctx) == "INDUCTOR"
    assert by_id("fsdp_auto_wrap_policy").parse("size_based_wrap", ctx) == "SIZE_BASED_WRAP"
    assert by_id("zero_stage").parse(3, ctx) == "3"
    # YAML 1.1 turns on/off and no into booleans: map them back to the choice
    assert by_id("gradient_checkpointing").parse(True, ctx) == "on"
    assert by_id("mixed_precision").parse(False, ctx) == "no"


def test_unknown_choice_names_the_field_and_the_choices():
    e = error(by_id("backend").parse, "megatron", Context(hardware=gpus(1)))
    assert e.field == "backend" and "megatron" in e.problem
    assert e.allowed == "auto, ddp, deepspeed, fsdp"


def test_counts_sizes_and_fractions():
    ctx = Context(hardware=gpus(1))
    assert by_id("params").parse("7B", ctx) == 7_000_000_000
    assert by_id("fsdp_min_num_params").parse("1e8", ctx) == 100_000_000
    assert by_id("cuda_context").parse("1.5G", ctx) == int(1.5 * GiB)
    assert by_id("headroom").parse("15%", ctx) == pytest.approx(0.15)
    assert by_id("headroom").parse("0", ctx) == 0.0


def test_parse_is_idempotent_on_normalised_values():
    hw = gpus(8)
    a = pre(hw, {"gpu_ids": " 3, 1", "seq_len": "4096", "headroom": "5%"})
    assert a["gpu_ids"] == "3,1"
    again = pre(hw, {k: v for k, v in a.items() if v is not None})
    assert again == a


# ----------------------------------------------------------------------------- validation: one line, field named

@pytest.mark.parametrize("given,field,fragment", [
    ({"seq_len": "abc"}, "seq-len", "not a whole number"),
    ({"seq_len": "2.5"}, "seq-len", "not a whole number"),
    ({"seq_len": "0"}, "seq-len", "at least 1"),
    ({"micro_batch": "-1"}, "micro-batch", "at least 1"),
    ({"grad_accum": "0"}, "grad-accum", "at least 1"),
    ({"num_processes": "0"}, "num-processes", "at least 1"),
    ({"num_machines": "0"}, "num-machines", "at least 1"),
    ({"params": "abc"}, "params", "not a count"),
    ({"params": "-7B"}, "params", ""),
    ({"params": "0"}, "params", "greater than zero"),
    ({"precision": "bf17"}, "precision", "not one of the choices"),
    ({"zero_stage": "4"}, "zero-stage", "not one of the choices"),
    ({"headroom": "0.9"}, "headroom", "outside"),
    ({"headroom": "-0.1"}, "headroom", "outside"),
    ({"headroom": "lots"}, "headroom", "not a number"),
    ({"num_machines": "2", "main_process_ip": "999.1.1.1"}, "main-process-ip", "not an IP"),
    ({"num_machines": "2", "main_process_ip": "a b"}, "main-process-ip", "not an IP"),
    ({"num_machines": "2", "main_process_ip": "10.0.0.1", "main_process_port": "70000"},
     "main-process-port", "not a port"),
    ({"num_machines": "2", "main_process_ip": "10.0.0.1", "main_process_port": "-1"},
     "main-process-port", "not a port"),
    ({"num_machines": "2", "main_process_ip": "10.0.0.1", "main_process_port": "http"},
     "main-process-port", "not a whole number"),
    ({"num_machines": "2", "machine_rank": "2", "main_process_ip": "10.0.0.1"}, "machine-rank", "outside"),
    ({"num_machines": "2", "machine_rank": "-1", "main_process_ip": "10.0.0.1"}, "machine-rank", "outside"),
    ({"num_machines": "2"}, "main-process-ip", "required"),
    ({"gpu_ids": "0,1,1"}, "gpu-ids", "twice"),
    ({"gpu_ids": "0,8"}, "gpu-ids", "does not exist"),
    ({"gpu_ids": "0,,1"}, "gpu-ids", "not a list"),
    ({"gpu_ids": "first"}, "gpu-ids", "not a list"),
    ({"num_processes": "16"}, "num-processes", "only 8 GPUs"),
    ({"gpu_ids": "0,1", "num_processes": "4"}, "num-processes", "only 2 GPUs"),
    ({"num_machines": "2", "main_process_ip": "h", "num_processes": "3"}, "num-processes", "divide evenly"),
    ({"offload": "nvme", "nvme_path": "/does/not/exist"}, "nvme-path", "does not exist"),
    ({"offload": "nvme"}, "nvme-path", "required"),
    ({"backend": "fsdp", "offload": "nvme"}, "offload", "not allowed"),
    ({"zero_stage": "2", "offload": "nvme"}, "offload", "needs ZeRO-3"),
    ({"model": "/some/model", "params": "7B"}, "model", "not both"),
    ({"hidden_size": "0", "params": "7B"}, "hidden-size", "at least 1"),
])
def test_bad_values_raise_one_line_input_errors_naming_the_field(given, field, fragment):
    e = error(pre, gpus(8), given)
    assert e.field == field
    assert fragment in str(e)
    assert str(e).startswith(field + ":")


def test_nvme_path_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    e = error(pre, gpus(8), {"offload": "nvme", "nvme_path": str(f)})
    assert e.field == "nvme-path" and "not a directory" in e.problem
    ok = pre(gpus(8), {"offload": "nvme", "nvme_path": str(tmp_path)})
    assert ok["nvme_path"] == str(tmp_path)


def test_nvme_path_only_checked_when_offload_could_use_it():
    a = pre(gpus(8), {"offload": "cpu", "nvme_path": "/does/not/exist"})
    assert "nvme_path" not in a
    a = pre(gpus(8), {"backend": "fsdp", "nvme_path": "/does/not/exist"})
    assert "nvme_path" not in a


def test_bf16_is_refused_on_gpus_without_it():
    v100 = gpus(4, name="Tesla V100-SXM2-32GB", mem=32, cc=(7, 0))
    e = error(pre, v100, {"precision": "bf16"})
    assert e.field == "precision" and "7.0" in e.problem
    assert pre(v100, {"precision": "fp16"})["precision"] == "fp16"


def test_hosts():
    for good in ("10.0.0.1", "::1", "fe80::1", "node01", "gpu-a.cluster.local", "localhost"):
        assert is_valid_host(good), good
    for bad in ("999.1.1.1", "1.2.3", "a b", "", "-node", "node_1", "x" * 300):
        assert not is_valid_host(bad), bad


def test_ports_zero_means_any_free_port():
    a = pre(gpus(8), {"num_machines": 2, "main_process_ip": "10.0.0.1", "main_process_port": "0"})
    assert a["main_process_port"] == 0
    a = pre(gpus(8), {"num_machines": 2, "main_process_ip": "10.0.0.1", "main_process_port": "65535"})
    assert a["main_process_port"] == 65535


def test_use_cpu_lifts_the_gpu_limit_on_processes():
    a = pre(gpus(2), {"use_cpu": "yes", "num_processes": "6"})
    assert a["num_processes"] == 6 and a["use_cpu"] is True and "gpu_ids" not in a


# ----------------------------------------------------------------------------- defaults

def test_defaults_one_gpu_box():
    hw = gpus(1, name="NVIDIA A100-SXM4-80GB", cc=(8, 0))
    a = pre(hw, {"params": "7B"})
    assert a["num_machines"] == 1 and a["num_processes"] == 1 and a["gpu_ids"] == "all"
    assert a["use_cpu"] is False
    assert a["seq_len"] == 2048 and a["micro_batch"] == 1 and a["grad_accum"] == 1
    assert a["backend"] == "auto" and a["headroom"] == pytest.approx(0.10)
    assert not {"machine_rank", "main_process_ip", "main_process_port", "same_network", "rdzv_backend"} & set(a)
    p = plan("single", processes=1)
    d = answers.resolve("details", Context(hardware=hw, model=LLAMA, plan=p, answers=a), {})
    assert answers.distributed_type(a, p) == "NO"
    assert d["mixed_precision"] == "bf16"
    assert d["use_dynamo"] is False
    assert d["enable_cpu_affinity"] is False
    assert "debug" not in d, "accelerate asks debug only for distributed types"
    assert not any(k.startswith(("fsdp_", "zero3_", "deepspeed_")) for k in d)


def test_defaults_eight_gpu_box():
    hw = gpus(8)
    a = pre(hw)
    assert a["num_processes"] == 8
    assert pre(hw, {"gpu_ids": "0,1,2,3"})["num_processes"] == 4
    two = pre(hw, {"num_machines": 2, "main_process_ip": "10.0.0.1"})
    assert two["num_processes"] == 16
    assert two["machine_rank"] == 0 and two["main_process_port"] == 29500 and two["same_network"] is True
    assert "rdzv_backend" not in two
    p = plan("ddp")
    d = answers.resolve("details", Context(hardware=hw, model=LLAMA, plan=p, answers=a), {})
    assert answers.distributed_type(a, p) == "MULTI_GPU"
    assert d["debug"] is False and d["enable_cpu_affinity"] is False and d["mixed_precision"] == "bf16"


def test_defaults_zero_gpu_box_with_explicit_backend_means_cpu_processes():
    hw = no_gpu()
    a = pre(hw, {"params": "125M", "backend": "ddp", "num_processes": "2"})
    assert a["use_cpu"] is True and a["num_processes"] == 2 and "gpu_ids" not in a
    topo = answers.topology(a, hw)
    assert topo.cpu and topo.world_size == 2
    p = plan("ddp", precision="fp32", processes=2, cpu=True)
    assert answers.distributed_type(a, p) == "MULTI_CPU"
    d = answers.resolve("details", Context(hardware=hw, model=LLAMA, plan=p, answers=a), {})
    assert d["mixed_precision"] == "no"
    assert "enable_cpu_affinity" not in d, "the NUMA question is NVIDIA-only"
    assert d["use_mpirun"] is False
    with pytest.raises(InputError, match="mpirun_config"):
        answers.resolve("details", Context(hardware=hw, model=LLAMA, plan=p, answers=a), {"use_mpirun": "yes"})


def test_zero_gpu_box_explicit_backend_alone_or_processes_alone():
    assert pre(no_gpu(), {"backend": "deepspeed"})["use_cpu"] is True
    assert pre(no_gpu(), {"num_processes": "3"})["use_cpu"] is True
    plain = pre(no_gpu())
    assert plain["use_cpu"] is False and plain["num_processes"] == 1
    # explicit no wins over the default
    assert pre(no_gpu(), {"backend": "ddp", "use_cpu": "no"})["use_cpu"] is False


def test_slurm_hints_give_machine_defaults():
    hw = gpus(8)
    hw.num_machines_hint = 4
    hw.env = {"SLURM_NNODES": "4", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-10]"}
    a = pre(hw)
    assert a["num_machines"] == 4 and a["machine_rank"] == 2 and a["main_process_ip"] == "gpu07"
    assert a["num_processes"] == 32
    assert first_slurm_host("node1,node2") == "node1"
    assert first_slurm_host("a[1,3-4]") == "a1"
    assert first_slurm_host(None) is None


def test_deepspeed_zero3_defaults():
    hw = gpus(8)
    d = details(hw, plan("deepspeed", 3))
    assert d["zero3_init_flag"] is True and d["zero3_save_16bit_model"] is True
    assert d["gradient_clipping"] == 1.0
    assert d["deepspeed_moe_layer_cls_names"] is None
    assert "mixed_precision" not in d, "precision lives in ds_config.json"
    assert not any(k.startswith("fsdp_") for k in d)
    assert "deepspeed_multinode_launcher" not in d


def test_deepspeed_zero2_defaults():
    d = details(gpus(8), plan("deepspeed", 2))
    assert d["zero3_init_flag"] is False
    assert "zero3_save_16bit_model" not in d


def test_deepspeed_multinode_launcher_and_hostfile_conditions():
    p = plan("deepspeed", 3, processes=16, machines=2)
    multi = {"num_machines": 2, "main_process_ip": "10.0.0.1"}
    d = details(gpus(8), p, pre_given=multi)
    assert d["deepspeed_multinode_launcher"] == "standard"
    assert "deepspeed_hostfile" not in d
    why = by_id("deepspeed_multinode_launcher").why_default(Context(hardware=gpus(8)))
    assert "ssh" in why and "torchrun" in why
    d = details(gpus(8), p, {"deepspeed_multinode_launcher": "PDSH"}, pre_given=multi)
    assert d["deepspeed_multinode_launcher"] == "pdsh" and d["deepspeed_hostfile"] == "/job/hostfile"
    assert d["deepspeed_exclusion_filter"] is None


def test_fsdp_defaults_follow_the_model_and_the_plan():
    d = details(gpus(8), plan("fsdp", reshard=True, gc=True))
    assert d["fsdp_version"] == 2
    assert d["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert d["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert d["fsdp_reshard_after_forward"] is True
    assert d["fsdp_offload_params"] is False
    assert d["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
    assert d["fsdp_cpu_ram_efficient_loading"] is True
    assert d["fsdp_activation_checkpointing"] is True
    assert d["mixed_precision"] == "bf16"
    assert "fsdp_min_num_params" not in d and "fsdp_sharding_strategy" not in d
    assert not any(k.startswith(("zero3_", "deepspeed_")) for k in d)
    d = details(gpus(8), plan("fsdp", reshard=False, offload="cpu"))
    assert d["fsdp_reshard_after_forward"] is False and d["fsdp_offload_params"] is True
    assert d["fsdp_activation_checkpointing"] is False


def test_fsdp_size_wrap_and_version_1():
    d = details(gpus(8), plan("fsdp"), {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"})
    assert d["fsdp_min_num_params"] == 100_000_000 and "fsdp_transformer_layer_cls_to_wrap" not in d
    d = details(gpus(8), plan("fsdp", reshard=True), {"fsdp_version": "1"})
    assert d["fsdp_version"] == 1
    assert d["fsdp_sharding_strategy"] == "FULL_SHARD" and "fsdp_reshard_after_forward" not in d
    assert d["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert d["fsdp_backward_prefetch"] == "BACKWARD_PRE" and d["fsdp_use_orig_params"] is True
    assert "fsdp_sync_module_states" not in d   # cpu-ram-efficient loading implies it
    d = details(gpus(8), plan("fsdp"), {"fsdp_version": 1, "fsdp_cpu_ram_efficient_loading": "no"})
    assert d["fsdp_sync_module_states"] is True


def test_fsdp_state_dict_choices_depend_on_the_version():
    e = error(details, gpus(8), plan("fsdp"), {"fsdp_state_dict_type": "LOCAL_STATE_DICT"})
    assert e.field == "fsdp-state-dict-type" and "SHARDED_STATE_DICT" in e.allowed
    d = details(gpus(8), plan("fsdp"), {"fsdp_version": 1, "fsdp_state_dict_type": "local_state_dict"})
    assert d["fsdp_state_dict_type"] == "LOCAL_STATE_DICT"
    e = error(details, gpus(8), plan("fsdp"), {"fsdp_version": "3"})
    assert e.field == "fsdp-version"


def test_fsdp_layer_class_unknown_without_a_config():
    d = details(gpus(8), plan("fsdp"), model=None, pre_given={"params": "7B"})
    assert d["fsdp_transformer_layer_cls_to_wrap"] is None
    e = error(details, gpus(8), plan("fsdp"), {"fsdp_transformer_layer_cls_to_wrap": "Llama Layer"})
    assert e.field == "fsdp-transformer-layer-cls-to-wrap"
    d = details(gpus(8), plan("fsdp"), {"fsdp_transformer_layer_cls_to_wrap": "A, B"})
    assert d["fsdp_transformer_layer_cls_to_wrap"] == "A,B"


def test_mixed_precision_follows_the_plan():
    assert details(gpus(8), plan("ddp", precision="fp16"))["mixed_precision"] == "fp16"
    assert details(gpus(8), plan("ddp", precision="fp32"))["mixed_precision"] == "no"


def test_dynamo_questions_only_when_compiling():
    d = details(gpus(8), plan("ddp"))
    assert d["use_dynamo"] is False and "dynamo_backend" not in d
    # accelerate asks the four compile options only after "customize the defaults?": so do we
    d = details(gpus(8), plan("ddp"), {"use_dynamo": "yes"})
    assert d["dynamo_backend"] == "INDUCTOR" and d["dynamo_customize"] is False
    assert not {"dynamo_mode", "dynamo_use_fullgraph", "dynamo_use_dynamic"} & set(d)
    # giving one of them means customising
    d = details(gpus(8), plan("ddp"), {"use_dynamo": "yes", "dynamo_mode": "MAX-AUTOTUNE"})
    assert d["dynamo_customize"] is True and d["dynamo_mode"] == "max-autotune"
    assert d["dynamo_use_fullgraph"] is False and d["dynamo_use_regional_compilation"] is False
    d = details(gpus(8), plan("ddp"), {"use_dynamo": "yes", "dynamo_customize": "yes"})
    assert d["dynamo_mode"] == "default"


# ----------------------------------------------------------------------------- multi-node conditions

def test_multinode_questions_only_with_more_than_one_machine():
    single = pre(gpus(8))
    assert not {"machine_rank", "main_process_ip", "main_process_port", "same_network"} & set(single)
    multi = pre(gpus(8), {"num_machines": "2", "main_process_ip": "node01"})
    assert {"machine_rank", "main_process_ip", "main_process_port", "same_network"} <= set(multi)
    assert "rdzv_backend" not in multi, "asked only when the nodes are not on one network"
    cloud = pre(gpus(8), {"num_machines": "2", "main_process_ip": "node01", "same_network": "no",
                          "rdzv_backend": "C10D"})
    assert cloud["rdzv_backend"] == "c10d"
    assert pre(gpus(8), {"num_machines": "2", "main_process_ip": "node01",
                         "same_network": "no"})["rdzv_backend"] == "static"


def test_strategy_conditions():
    ddp = pre(gpus(8), {"backend": "ddp"})
    assert not {"zero_stage", "offload", "nvme_path"} & set(ddp)
    fsdp = pre(gpus(8), {"backend": "fsdp"})
    assert "zero_stage" not in fsdp and fsdp["offload"] == "auto" and "nvme_path" not in fsdp
    ds = pre(gpus(8), {"backend": "deepspeed", "offload": "cpu"})
    assert ds["zero_stage"] == "auto" and "nvme_path" not in ds


def test_model_shape_questions_only_with_params():
    a = pre(gpus(1), {"model": "/some/dir"})
    assert a["model"] == "/some/dir" and not {"params", "hidden_size", "layers", "heads", "vocab_size"} & set(a)
    a = pre(gpus(1), {"params": "7B", "layers": "40"})
    assert a["params"] == 7_000_000_000 and a["layers"] == 40 and a["hidden_size"] is None


# ----------------------------------------------------------------------------- contradicting answers (issue 12)

@pytest.mark.parametrize("given, flag, other", [
    ({"backend": "ddp", "zero_stage": "3"}, "zero-stage", "--backend ddp"),
    ({"backend": "fsdp", "zero_stage": "3"}, "zero-stage", "--backend fsdp"),
    ({"backend": "ddp", "offload": "cpu"}, "offload", "--backend ddp"),
])
def test_an_answer_its_condition_excludes_is_refused_naming_both(given, flag, other):
    conflicts: list = []
    answers.resolve(PRE_PLAN, Context(hardware=gpus(8)), {"params": "7B", **given}, conflicts=conflicts)
    assert len(conflicts) == 1
    assert conflicts[0].field == flag and other in conflicts[0].problem


def test_a_details_answer_excluded_by_the_users_backend_is_refused_but_not_one_the_plan_excluded():
    hw = gpus(8)
    for backend, expect in (("fsdp", ["--backend fsdp"]), ("auto", [])):
        a = pre(hw, {"params": "7B", "backend": backend})
        conflicts: list = []
        answers.resolve("details", Context(hardware=hw, model=LLAMA, plan=plan("fsdp"), answers=a),
                        {"backend": backend, "zero3_init_flag": "yes"}, conflicts=conflicts)
        assert [c.problem.split("conflicts with ")[1].split(":")[0] for c in conflicts] == expect


def test_precision_and_mixed_precision_must_agree():
    from wizard.config.questions import check_precision_pair
    with pytest.raises(InputError, match="conflicts with --precision bf16"):
        check_precision_pair("bf16", "fp16")
    for precision, mixed in (("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "no"), ("auto", "fp16"), (None, "fp16")):
        check_precision_pair(precision, mixed)


def test_huge_integers_are_refused_before_python_parses_them():
    with pytest.raises(InputError, match="more than 18 digits"):
        by_id("seq_len").coerce("9" * 5000)


@pytest.mark.parametrize("hardware", [None, "8 GPUs"])
def test_defaults_without_a_probe_model_or_plan_answer_or_raise_what_f1_catches(hardware):
    """The TUI's F1 (screens/base.explanation) shows no recommendation on AttributeError/TypeError: what a
    default reading a hardware, model or plan that is not there yet (None) raises. Anything else would crash it."""
    ctx = Context(hardware=gpus(8) if hardware else None, answers={"num_processes": "x", "seq_len": None})
    failed = []
    for q in QUESTIONS:
        for ask in (q.default, q.why_default):
            try:
                ask(ctx)
            except (AttributeError, TypeError):
                failed.append(q.id)
    assert bool(failed) == (hardware is None)
