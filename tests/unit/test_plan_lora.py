"""LoRA / QLoRA in the plan, through the pipeline (test_lora.py tests wizard.sizing.lora itself): trainable counts as
peft counts them, the adapter ladder, the alternatives full fine-tuning names, speed against full fine-tuning,
DDP's buckets, and QLoRA + ZeRO-3's zero3_init_flag."""

from __future__ import annotations

import pytest

from tests.unit.test_lora import _peft_counts, _tiny_configs
from wizard import pipeline
from wizard.config.answers import training_options
from wizard.errors import InputError
from wizard.pipeline import Request
from wizard.planning.plan import StrategyOptions, ladder_keys, rung_by_key
from wizard.sizing.memory import CUDA_CONTEXT_BYTES
from wizard.sizing.model import size_model

ARCHES = ["llama", "mistral", "qwen2", "gemma2", "mixtral", "gpt2"]


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """The tiny configs of test_lora.py as config.json directories, read back as the wizard reads a model."""
    out = {}
    for arch, config in _tiny_configs().items():
        directory = tmp_path_factory.mktemp(arch)
        config.save_pretrained(directory)
        out[arch] = str(directory)
    return out


# --- trainable counts: pipeline.adapters_for == peft's get_nb_trainable_parameters() --------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_trainable_counts_through_the_pipeline_equal_peft(model_dirs, arch):
    shape = size_model(model_dirs[arch])
    config = _tiny_configs()[arch]
    for rank in (8, 32):
        for targets in (None, "all-linear"):
            # dropout 0: peft wraps MoE expert parameters under all-linear only without dropout (Mixtral).
            training = training_options({"method": "lora", "lora_rank": rank, "lora_targets": targets,
                                         "lora_dropout": 0.0})
            adapters = pipeline.adapters_for(shape, training)
            trainable, total = _peft_counts(config, rank, targets)
            assert (adapters.trainable_params, adapters.frozen_params) == (trainable, total - trainable), \
                (arch, rank, targets)


def test_the_plan_carries_the_counted_adapters(model_dirs):
    """The chosen rung's gradients are the adapters' (fp32 under torch AMP on one GPU), not the model's."""
    result = pipeline.build(Request(assume="1xA100-80GB", output_dir="/tmp/unused",
                                    given={"model": model_dirs["llama"], "method": "lora", "lora_rank": 8}))
    adapters = pipeline.adapters_for(result.model, training_options(result.answers))
    single = rung_by_key(result.plan, "single")
    assert single.breakdown["gradients"] == 4 * adapters.trainable_params
    assert any(f"{adapters.trainable_params:,} trainable parameters" in n for n in result.plan.notes)


# --- the ladder --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_adapter_ladder_keys(method):
    auto = StrategyOptions()
    # FSDP-QLoRA / FSDP-LoRA and the rungs that move the frozen base to the CPU are in the auto ladder; offload last.
    sharded = ["fsdp-noreshard", "fsdp-reshard"]
    offload = ["zero3-offload-all", "fsdp-offload"]
    assert ladder_keys(auto, 8, method=method) == ["ddp", "zero2", "zero3"] + sharded + offload
    assert ladder_keys(StrategyOptions(backend="ddp"), 8, method=method) == ["ddp"]
    assert ladder_keys(StrategyOptions(backend="deepspeed"), 8, method=method) == ["zero2", "zero3",
                                                                                     "zero3-offload-all"]
    assert ladder_keys(StrategyOptions(backend="deepspeed", zero_stage="1"), 8, method=method) == ["zero1"]
    assert ladder_keys(StrategyOptions(backend="deepspeed", zero_stage="3"), 8, method=method) == ["zero3",
                                                                                                    "zero3-offload-all"]
    assert ladder_keys(StrategyOptions(backend="fsdp"), 8, method=method) == sharded + ["fsdp-offload"]
    assert ladder_keys(StrategyOptions(offload="cpu"), 8, method=method) == offload
    assert ladder_keys(StrategyOptions(backend="fsdp", offload="none"), 8, method=method) == sharded
    # No optimizer-only offload rung for adapters: their optimizer states are tiny.
    assert not any(k.endswith("offload-opt") for k in ladder_keys(auto, 8, method=method))
    assert "zero3-offload-opt" in ladder_keys(auto, 8)


@pytest.mark.parametrize("method", ["lora", "qlora"])
@pytest.mark.parametrize("strategy,field", [(StrategyOptions(backend="deepspeed", zero_stage="2", offload="cpu"),
                                             "--offload"),
                                            (StrategyOptions(backend="deepspeed", offload="nvme"), "--offload"),
                                            (StrategyOptions(backend="ddp", offload="cpu"), "--offload"),
                                            (StrategyOptions(backend="fsdp", zero_stage="3"), "--zero-stage"),
                                            (StrategyOptions(backend="ddp", zero_stage="2"), "--zero-stage")])
def test_offload_of_the_adapters_alone_and_nvme_are_refused(method, strategy, field):
    with pytest.raises(InputError) as e:
        ladder_keys(strategy, 8, method=method)
    assert e.value.field == field


def test_refusal_reaches_the_cli_as_exit_2(model_dirs):
    with pytest.raises(InputError) as e:
        pipeline.build(Request(assume="8xA100-80GB", output_dir="/tmp/unused",
                               given={"model": model_dirs["llama"], "method": "lora", "backend": "deepspeed",
                                      "zero_stage": "2", "offload": "cpu"}))
    assert e.value.exit_code == 2


# --- DDP's gradient buckets hold only what requires grad ---------------------------------------------------

def test_ddp_buckets_hold_the_adapters_not_the_frozen_base():
    """torch DDP buckets only parameters with requires_grad (_build_params_for_reducer): for LoRA that is the
    adapters, so the buckets are 4 B x trainable, not 4 B x the model (which made 70B QLoRA on 2 x A100-80GB
    look like 397 GiB per GPU under DDP)."""
    given = {"params": "7B", "method": "lora", "backend": "ddp"}
    result = pipeline.build(Request(assume="8xA100-80GB", output_dir="/tmp/unused", given=given))
    adapters = pipeline.adapters_for(result.model, training_options(result.answers))
    assert rung_by_key(result.plan, "ddp").breakdown["buffers"] == 4 * adapters.trainable_params
    full = pipeline.build(Request(assume="8xA100-80GB", output_dir="/tmp/unused",
                                  given={"params": "7B", "backend": "ddp"}))
    assert rung_by_key(full.plan, "ddp").breakdown["buffers"] == 4 * full.model.params


# --- alternatives ------------------------------------------------------------------------------------------

def test_alternatives_named_when_full_fine_tuning_offloads():
    result = pipeline.build(Request(assume="1xA100-80GB,ram=512G", output_dir="/tmp/unused", given={"params": "7B"}))
    assert result.plan.choice.offloads
    alts = {a.method: a for a in result.plan.alternatives}
    assert set(alts) == {"lora", "qlora"}
    for alt in alts.values():
        assert alt.choice is not None and not alt.choice.offloads and alt.rank == 16
        assert alt.choice.tokens_per_second > result.plan.choice.tokens_per_second
        assert "faster than" in alt.text and result.plan.choice.name in alt.text
    doc = result.plan.to_json()["alternatives"]
    assert [a["method"] for a in doc] == ["lora", "qlora"] and all(a["choice"] for a in doc)


def test_no_alternatives_when_full_fine_tuning_fits_on_the_gpus():
    result = pipeline.build(Request(assume="8xA100-80GB", output_dir="/tmp/unused", given={"params": "7B"}))
    assert not result.plan.choice.offloads
    assert result.plan.alternatives == []
    lora = pipeline.build(Request(assume="1xA100-80GB,ram=512G", output_dir="/tmp/unused",
                                  given={"params": "7B", "method": "lora"}))
    assert lora.plan.alternatives == []           # only full fine-tuning names them


# --- speed -------------------------------------------------------------------------------------------------

def _rung(given, key, assume="8xA100-80GB"):
    result = pipeline.build(Request(assume=assume, output_dir="/tmp/unused", given=given))
    return rung_by_key(result.plan, key)


def test_lora_is_faster_than_full_fine_tuning_on_the_same_rung_and_qlora_pays_dequantisation():
    same = {"params": "7B", "backend": "deepspeed", "zero_stage": "3", "gradient_checkpointing": "off"}
    full = _rung(same, "zero3")
    lora = _rung({**same, "method": "lora"}, "zero3")
    qlora = _rung({**same, "method": "qlora"}, "zero3")
    assert not full.gradient_checkpointing and not lora.gradient_checkpointing
    # No weight gradients for the frozen base: backward is about half of full fine-tuning's FLOPs, so a step
    # costs about 2/3 of full fine-tuning's in compute, before communication and overheads.
    ratio = lora.speed.step_seconds / full.speed.step_seconds
    assert 0.4 < ratio < 0.9, ratio
    assert qlora.speed.step_seconds > lora.speed.step_seconds


# --- QLoRA + ZeRO-3 needs zero3_init_flag ------------------------------------------------------------------

def test_qlora_zero3_refuses_zero3_init_flag_off(model_dirs):
    given = {"model": model_dirs["llama"], "method": "qlora", "backend": "deepspeed", "zero_stage": "3"}
    ok = pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused", given=given))
    assert ok.accelerate_doc["deepspeed_config"]["zero3_init_flag"] is True
    with pytest.raises(InputError) as e:
        pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused",
                               given={**given, "zero3_init_flag": False}))
    assert e.value.field == "zero3_init_flag"
    # LoRA (16-bit base) may turn it off.
    lora = pipeline.build(Request(assume="2xA100-80GB", output_dir="/tmp/unused",
                                  given={**given, "method": "lora", "zero3_init_flag": False}))
    assert lora.accelerate_doc["deepspeed_config"]["zero3_init_flag"] is False


# --- host RAM while the base model loads ------------------------------------------------------------------

def test_qlora_streams_the_base_to_the_gpus_instead_of_holding_it_in_host_ram():
    """bitsandbytes' quantiser gives from_pretrained device_map={"": current GPU}, so under DDP / ZeRO-2 a QLoRA
    process never holds the whole base in host RAM (LoRA in bf16 does: transformers materialises it on the CPU
    first). Nor under ZeRO-3 or FSDP: transformers builds a quantised model without zero.Init and loads it
    through the same device map (rank 0 reads the state dict only for an unquantised ZeRO-3 model)."""
    import inspect

    from transformers import PreTrainedModel
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer

    assert 'device_map = {"": torch.cuda.current_device()}' in inspect.getsource(Bnb4BitHfQuantizer.update_device_map)
    assert "if not is_quantized and not _is_ds_init_called" in inspect.getsource(PreTrainedModel.get_init_context)
    assert "if is_deepspeed_zero3_enabled() and not is_quantized:" in \
        inspect.getsource(PreTrainedModel._load_pretrained_model)

    def host(method: str, key: str) -> int:
        backend = "deepspeed" if key.startswith("zero") else "fsdp" if key.startswith("fsdp") else "ddp"
        given = {"params": "70B", "method": method, "backend": backend}
        result = pipeline.build(Request(assume="8xA100-80GB,ram=1T", output_dir="/tmp/unused", given=given))
        return rung_by_key(result.plan, key).cpu_bytes, result.model

    qlora_ddp, model = host("qlora", "ddp")
    lora_ddp, _ = host("lora", "ddp")
    assert lora_ddp == 8 * model.params * 2                        # eight bf16 copies in host RAM
    largest = max(model.largest_layer_params, model.vocab_size * model.hidden_size)
    assert qlora_ddp == 8 * largest * 2                            # one module in transit per process
    assert qlora_ddp < lora_ddp / 50
    assert host("qlora", "zero2")[0] == qlora_ddp
    assert host("qlora", "zero3")[0] == qlora_ddp                  # no zero.Init for a quantised model
    assert host("lora", "zero3")[0] == model.params * 2             # rank 0 alone reads it for zero.Init, not 8
    assert host("qlora", "fsdp-reshard")[0] == qlora_ddp           # FSDP's meta loading skips quantised models
    assert host("lora", "fsdp-reshard")[0] == model.params * 2     # fsdp_cpu_ram_efficient_loading: local rank 0


# --- FSDP-LoRA / FSDP-QLoRA and the rungs that move the frozen base to the CPU -----------------------------

def _plan(method: str, assume: str, **given):
    result = pipeline.build(Request(assume=assume, output_dir="/tmp/unused",
                                    given={"params": "70B", "method": method, **given}))
    adapters = pipeline.adapters_for(result.model, training_options(result.answers))
    return result.plan, adapters


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_fsdp_shards_the_frozen_base_and_the_adapter_states(method):
    """FSDP2 shards every parameter, the frozen base included (QLoRA's codes in the compute dtype, the constants
    whole on every GPU); the adapters' fp32 weights, gradients and AdamW states are sharded too. Without
    resharding the whole gathered base stays alive; with CPU offload only the constants stay on the GPU."""
    plan, a = _plan(method, "4xA100-80GB,ram=1T", backend="fsdp")
    w, world, t = 2, 4, a.trainable_params
    if method == "qlora":
        partitioned, whole = a.nf4_weight_bytes + a.unquantized_params * w, a.nf4_constant_bytes
    else:
        partitioned, whole = a.frozen_params * w, 0
    reshard, keep, offload = (rung_by_key(plan, k) for k in ("fsdp-reshard", "fsdp-noreshard", "fsdp-offload"))
    assert reshard.breakdown["parameters"] == partitioned // world + whole + 4 * t // world
    assert reshard.breakdown["gradients"] == 4 * t // world
    assert reshard.breakdown["optimizer"] == 8 * t // world
    assert keep.breakdown["parameters"] - reshard.breakdown["parameters"] == partitioned + w * t
    assert offload.breakdown["parameters"] == whole and offload.breakdown["optimizer"] == 0
    assert offload.cpu_bytes >= int((partitioned + 16 * t) * 1.5)
    # the frozen base is a few hundred times the adapters: sharding it is what FSDP buys
    assert reshard.breakdown["parameters"] < rung_by_key(plan, "fsdp-noreshard").breakdown["parameters"] / 3


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_zero3_parameter_offload_moves_the_partitioned_base_to_the_cpu(method):
    plan, a = _plan(method, "4xA100-80GB,ram=1T", backend="deepspeed", zero_stage="3")
    on_gpu, offloaded = rung_by_key(plan, "zero3"), rung_by_key(plan, "zero3-offload-all")
    partitioned = a.nf4_weight_bytes + a.unquantized_params * 2 if method == "qlora" else a.frozen_params * 2
    assert on_gpu.breakdown["parameters"] - offloaded.breakdown["parameters"] >= partitioned // 4
    assert offloaded.cpu_bytes >= int(partitioned * 1.5)


def test_qlora_on_a_sharding_rung_loads_the_whole_4bit_model_onto_every_gpu_first():
    """transformers builds a quantised model without zero.Init and outside FSDP's meta loading, and bitsandbytes'
    device map puts all of it on the rank's GPU: the loading peak is the whole 4-bit model, whatever the rung
    shards afterwards. LoRA (zero.Init / RAM-efficient loading) and unsharded rungs have no such moment."""
    plan, a = _plan("qlora", "2xRTX6000Ada-48GB,ram=256G")
    whole = a.frozen_bytes(2) + CUDA_CONTEXT_BYTES                         # + the CUDA context
    for key in ("zero3", "fsdp-reshard", "fsdp-noreshard", "zero3-offload-all", "fsdp-offload"):
        assert rung_by_key(plan, key).load_bytes == whole, key
    for key in ("ddp", "zero2"):
        assert rung_by_key(plan, key).load_bytes == 0
    lora, _ = _plan("lora", "2xRTX6000Ada-48GB,ram=256G")
    assert all(r.load_bytes == 0 for r in lora.rungs)


def test_70b_qlora_on_two_48gb_gpus_fits_with_fsdp():
    plan, _ = _plan("qlora", "2xRTX6000Ada-48GB,ram=256G")
    fsdp = rung_by_key(plan, "fsdp-reshard")
    assert fsdp.fits and fsdp.load_bytes <= plan.usable_bytes


def test_70b_qlora_on_two_4090s_plans_fsdp_qlora_and_says_by_how_much_it_misses(tmp_path):
    """The FSDP-QLoRA rungs are in the ladder; with transformers 5.24 every rank first quantises the whole 70B
    model onto its own 24 GB card, so nothing fits, and the message says so with the figure."""
    import contextlib
    import io

    from wizard.frontends.cli import main

    plan, a = _plan("qlora", "2xRTX4090,ram=128G")
    keys = [r.key for r in plan.rungs]
    assert {"fsdp-noreshard", "fsdp-reshard", "fsdp-offload", "zero3-offload-all"} <= set(keys)
    assert plan.choice is None
    offload = rung_by_key(plan, "fsdp-offload")
    assert offload.per_gpu_bytes <= plan.usable_bytes < offload.load_bytes   # training would fit; loading does not
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--params", "70B", "--assume", "2xRTX4090,ram=128G", "--method", "qlora"])
    assert code == 3
    text = err.getvalue()
    assert "while loading" in text and "more than the 21.6 GiB usable" in text, text


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_nothing_fits_explains_itself_for_adapters_in_every_front_end(model_dirs, method, tmp_path):
    """The TUI's Plan screen (WizardState.nothing_fits) and the CLI's exit-3 message (report.nothing_fits_message)
    both re-plan variants: with adapters they must reuse the plan's AdapterShape, not fail on it."""
    from wizard.frontends import report
    from wizard.frontends.session import WizardState
    given = {"model": model_dirs["llama"], "method": method, "seq_len": 1 << 22, "micro_batch": 4,
             "grad_accum": 2}
    request = Request(assume="1xT4-16GB", output_dir=str(tmp_path), given=given)
    result = pipeline.build(request)
    assert result.plan.choice is None
    assert result.plan.adapters is not None and result.plan.adapters.method == method
    text = report.nothing_fits_message(result)
    assert text.startswith("Nothing fits. The closest rung") and "AdapterShape" not in text
    assert "What would fit:" in text and "--seq-len" in text
    state = WizardState(request)
    state.set_probed(state.load_hardware())
    job = state.replan()
    while job is not None:
        job = state.sized(job.model, pipeline.size_for_plan(job.model, job.trainings), None)
    assert state.plan is not None and state.plan.choice is None
    assert state.nothing_fits() == text


def test_alternatives_are_compared_at_their_fastest_split_of_the_same_global_batch(tmp_path):
    """'LoRA ... 13x faster than ZeRO-2 + CPU optimizer offload' compared both at micro-batch 1, where the offload
    rung's own split of the global batch is several times faster. Both sides now run their fastest split of it."""
    from wizard.planning.speed import relative
    result = pipeline.build(Request(assume="1xA100-80GB,ram=256G", output_dir=str(tmp_path),
                                    given={"params": "7B", "global_batch": 32}))
    plan = result.plan
    assert plan.choice.offloads and plan.batch.applied and plan.batch.micro_batch > 1
    lora = next(a for a in plan.alternatives if a.method == "lora")
    assert lora.reference_speed is plan.batch.speed
    assert lora.split == (lora.choice.micro_batch, lora.choice.grad_accum)
    assert lora.split[0] * lora.split[1] == 32 and lora.split[0] > 1
    assert f"{relative(lora.choice.speed, plan.batch.speed)} than {plan.choice.name}" in lora.text
    assert f"(at micro-batch {plan.batch.micro_batch} x {plan.batch.grad_accum})" in lora.text
    # At micro-batch 1 x 32 the gap would be far wider: the comparison is not made there any more.
    at_one = pipeline.build(Request(assume="1xA100-80GB,ram=256G", output_dir=str(tmp_path),
                                    given={"params": "7B", "global_batch": 32, "micro_batch": 1}))
    ratio_now = lora.choice.tokens_per_second / plan.batch.speed.tokens_per_second
    ratio_one = (next(a for a in at_one.plan.alternatives if a.method == "lora").choice.tokens_per_second
                 / at_one.plan.choice.tokens_per_second)
    assert ratio_now < ratio_one


def test_an_offload_bound_choice_says_a_larger_micro_batch_amortises_the_cpu_step(tmp_path):
    from wizard.frontends.report import speed_lines
    from wizard.planning.speed import fmt_rate
    result = pipeline.build(Request(assume="1xA100-80GB,ram=256G", output_dir=str(tmp_path), given={"params": "7B"}))
    plan = result.plan
    assert plan.choice.speed.bound == "offload"
    a = plan.amortised
    assert a is not None and a.micro_batch == max(plan.choice.max_micro_batch, plan.choice.max_micro_batch_gc) > 1
    assert a.speed.tokens_per_second > 2 * plan.choice.tokens_per_second
    line = next(x for x in speed_lines(plan) if x.startswith("Offload-bound"))
    assert f"{plan.choice.speed.optimizer_seconds:.3g} s" in line and "amortises" in line
    assert f"micro-batch {a.micro_batch}" in line and f"≈{fmt_rate(a.speed.tokens_per_second)}" in line
    assert plan.to_json()["amortised"]["micro_batch"] == a.micro_batch
    # Not offload-bound: nothing to amortise, nothing said.
    fits = pipeline.build(Request(assume="8xA100-80GB", output_dir=str(tmp_path), given={"params": "7B"})).plan
    assert fits.amortised is None and not any(x.startswith("Offload-bound") for x in speed_lines(fits))


# --- the stated reasons: what the user forced, and what really costs a rung its speed -----------------------

_MODELS = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "models"
_LLAMA_70B = str(_MODELS / "llama-3-70b")


@pytest.mark.parametrize("model, method, backend", [("llama-3-70b", "qlora", "fsdp"),
                                                    ("llama-3-70b", "lora", "deepspeed"),
                                                    ("llama-3.1-8b", "full", "deepspeed")])
def test_a_choice_forced_onto_offload_does_not_claim_that_nothing_without_offload_fits(tmp_path, model, method,
                                                                                       backend):
    """`--offload cpu` plans only offload rungs; on 8 x H100 a rung without offload fits these models, so
    'no rung without offload fits' was false: the reason names the flag instead."""
    given = {"model": str(_MODELS / model), "method": method, "backend": backend, "offload": "cpu"}
    plan = pipeline.build(Request(assume="8xH100-80GB,ram=2T", output_dir=str(tmp_path), given=given)).plan
    assert plan.choice is not None and plan.choice.offloads
    assert "no rung without offload fits" not in plan.choice.reason, plan.choice.reason
    assert "--offload cpu" in plan.choice.reason, plan.choice.reason
    # Without the flag the same model fits without offload there (so the old sentence was really false).
    auto = pipeline.build(Request(assume="8xH100-80GB,ram=2T", output_dir=str(tmp_path),
                                  given={**given, "offload": "auto"})).plan
    assert not auto.choice.offloads


def test_a_rung_slower_for_its_smaller_micro_batch_says_so(tmp_path):
    """70B QLoRA on 2 x 48 GB, global batch 16, 17.5 % headroom: ZeRO-3 fits micro-batch 2 (39.3 GiB of 39.6),
    FSDP2 with resharding (0.6 GiB more per GPU) only 1, and FSDP2's slower step is all compute (its gathers
    are hidden: 0 s of communication). The reason said 'weights gathered for every layer, forward and
    backward'; it names the micro-batches."""
    given = {"model": _LLAMA_70B, "method": "qlora", "global_batch": 16, "headroom": 0.175}
    plan = pipeline.build(Request(assume="2xRTX6000Ada-48GB,ram=256G", output_dir=str(tmp_path), given=given)).plan
    fsdp = rung_by_key(plan, "fsdp-reshard")
    assert fsdp.fits and fsdp is not plan.choice and fsdp.micro_batch < plan.choice.micro_batch   # the case
    c, r = plan.choice.speed, fsdp.speed
    assert r.compute_seconds - c.compute_seconds > max(r.communication_seconds - c.communication_seconds,
                                                       r.overhead_seconds - c.overhead_seconds)
    assert "gathered for every layer" not in fsdp.reason, fsdp.reason
    assert (f"micro-batch {fsdp.micro_batch} (the largest that fits), against {plan.choice.micro_batch}"
            in fsdp.reason), fsdp.reason


@pytest.mark.parametrize("key, value, flag", [("lora_rank", 64, "lora-rank"), ("lora_targets", "q_proj,v_proj",
                                                                                "lora-targets"),
                                              ("lora_alpha", 128, "lora-alpha"), ("lora_dropout", 0.1, "lora-dropout")])
def test_adapter_options_without_an_adapter_method_are_refused_not_dropped(tmp_path, key, value, flag):
    """`wizard plan --lora-rank 64` (no --method) planned full fine-tuning and showed 'Instead: LoRA r=16':
    the flag vanished without a word. It is refused, naming the flag and the method, like --backend ddp
    --offload cpu; from the CLI that is exit 2 and one line."""
    import contextlib
    import io

    from wizard.frontends.cli import main

    with pytest.raises(InputError) as e:
        pipeline.build(Request(assume="4xA100-40GB,ram=512G", output_dir=str(tmp_path),
                               given={"params": "8B", key: value}))
    assert e.value.field == flag and "--method" in str(e.value) and "full" in str(e.value), str(e.value)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["plan", "--params", "8B", "--assume", "4xA100-40GB,ram=512G", f"--{flag}", str(value)])
    assert code == 2 and err.getvalue().count("\n") == 1 and "Traceback" not in err.getvalue(), err.getvalue()
    # With an adapter method the same flag is used.
    plan = pipeline.build(Request(assume="4xA100-40GB,ram=512G", output_dir=str(tmp_path),
                                  given={"params": "8B", "method": "lora", key: value})).plan
    assert plan.method["name"] == "lora"


def test_the_qlora_note_names_what_really_stays_unquantised(tmp_path):
    """Mixtral under transformers 5 keeps its experts as fused 3-D parameters that bitsandbytes does not
    quantise: 45.4B of its 46.7B parameters stay in 16 bits. The note called all of them 'embeddings, norms,
    LM head', hiding why QLoRA saves so little there."""
    def note(model):
        plan = pipeline.build(Request(assume="4xA100-80GB,ram=1T", output_dir=str(tmp_path),
                                      given={"model": str(_MODELS / model), "method": "qlora"})).plan
        return next(n for n in plan.notes if n.startswith("The 4-bit base"))
    moe = note("mixtral-8x7b")
    assert "outside nn.Linear" in moe and "fused MoE experts" in moe, moe
    assert "45,360,615,424 parameters (embeddings, norms, LM head)" not in moe, moe
    dense = note("llama-3.1-8b")
    assert "(embeddings, norms, LM head)" in dense and "outside nn.Linear" not in dense, dense


def test_qlora_that_nothing_fits_while_loading_names_lora_when_it_fits(tmp_path):
    """405B QLoRA on 2 x 8 H100: every sharding rung fails on the 4-bit model every rank loads whole, and the
    message said 'no single change makes a rung fit'. LoRA's 16-bit base is sharded while it loads (zero.Init,
    FSDP's RAM-efficient loading), and it fits there: the message names it, with the user's adapter options."""
    import contextlib
    import io

    from wizard.frontends.cli import main

    model = str(_MODELS / "llama-3.1-405b")
    result = pipeline.build(Request(assume="8xH100-80GB,nodes=2", output_dir=str(tmp_path), plan_only=True,
                                    given={"model": model, "method": "qlora", "lora_rank": 8}))
    assert result.plan.choice is None
    assert any(r.load_bytes > result.plan.usable_bytes for r in result.plan.rungs)
    lora = [a for a in result.plan.alternatives if a.method == "lora"]
    assert len(lora) == 1 and lora[0].choice is not None and lora[0].rank == 8
    assert not any(a.method == "qlora" for a in result.plan.alternatives)
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--model", model, "--assume", "8xH100-80GB,nodes=2", "--method", "qlora",
                     "--lora-rank", "8"])
    # the alternative is printed once, on its Instead: line; the exit line names --method lora and points at it
    assert code == 3 and "--method lora" in err.getvalue() and "see the Instead: line above" in err.getvalue(), \
        err.getvalue()
    assert "Instead:  LoRA r=8: fits with" in out.getvalue() and "LoRA r=8: fits with" not in err.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        main(["plan", "--model", model, "--assume", "8xH100-80GB,nodes=2", "--method", "qlora", "--lora-rank", "8",
              "--json"])
    assert "LoRA r=8: fits with" in err.getvalue(), err.getvalue()     # --json prints no Instead: lines


@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_8bit_adamw_never_lands_on_an_fsdp_rung(tmp_path, method):
    """bitsandbytes' 8-bit AdamW cannot step FSDP2's DTensor parameters (tests/functional/
    test_fsdp_8bit_optimizer.py): the plan chose FSDP2 with --optimizer adamw-8bit and wrote optim='adamw_bnb_8bit'
    beside an FSDP config, which fails at the first optimizer step. --backend fsdp with it is refused (exit 2);
    under --backend auto the FSDP rungs leave the ladder."""
    from wizard.planning.rungs import BY_KEY

    given = {"model": str(_MODELS / "llama-3.1-8b"), "method": method, "optimizer": "adamw-8bit"}
    with pytest.raises(InputError) as e:
        pipeline.build(Request(assume="4xA100-40GB,ram=512G", output_dir=str(tmp_path),
                               given={**given, "backend": "fsdp"}))
    assert e.value.field == "--optimizer" and "FSDP" in str(e.value)
    plan = pipeline.build(Request(assume="4xA100-40GB,ram=512G", output_dir=str(tmp_path), given=given)).plan
    assert plan.choice is not None and not any(BY_KEY[r.key].backend == "fsdp" for r in plan.rungs)
    # With torch's AdamW the same plan has FSDP rungs (for the adapters, the choice is one), so the filter is real.
    plain = pipeline.build(Request(assume="4xA100-40GB,ram=512G", output_dir=str(tmp_path),
                                   given={**given, "optimizer": "adamw", "backend": "fsdp"})).plan
    assert plain.choice is not None and BY_KEY[plain.choice.key].backend == "fsdp"


def test_choosing_full_in_the_wizard_drops_the_lora_options_given_before(tmp_path):
    """The pipeline refuses LoRA options with full fine-tuning; in the wizard, switching the method to full
    after typing a rank (or starting from `--method lora --lora-rank 64`) is the user's answer, not a conflict."""
    from wizard.frontends.session import WizardState
    state = WizardState(Request(assume="8xA100-80GB", output_dir=str(tmp_path),
                                given={"params": "7B", "method": "lora", "lora_rank": 64}))
    state.set_probed(state.load_hardware())
    state.set_answer("lora_alpha", 32)
    state.set_answer("method", "full")
    given = state.given()
    assert given["method"] == "full" and not any(k in given for k in pipeline.ADAPTER_OPTIONS), given
    assert pipeline.build(Request(assume="8xA100-80GB", output_dir=str(tmp_path), given=given)).plan.method["name"] == "full"


@pytest.mark.parametrize("method", ["lora", "qlora"])
def test_qlora_under_torch_amp_counts_an_fp32_residual_stream(method):
    """prepare_model_for_kbit_training (the snippet calls it for one GPU and DDP) makes the embeddings and every
    norm fp32, so under autocast each checkpointed layer input is fp32: 4 B per hidden element, not 2.
    DeepSpeed ZeRO-2 casts the parameters back to bf16 and keeps the 16-bit stream; LoRA is 16-bit everywhere."""
    result = pipeline.build(Request(assume="2xA100-80GB,ram=1T", output_dir="/tmp/unused", given={
        "params": "7B", "method": method, "gradient_checkpointing": "on", "seq_len": 4096, "micro_batch": 4}))
    ddp, zero2 = rung_by_key(result.plan, "ddp"), rung_by_key(result.plan, "zero2")
    tokens, hidden, layers = 4096 * 4, result.model.hidden_size, result.model.layers
    stream_delta = ddp.breakdown["activations"] - zero2.breakdown["activations"]
    if method == "qlora":
        assert stream_delta >= 2 * tokens * hidden * layers
    else:
        assert stream_delta == 0


@pytest.mark.parametrize("version, reenters", [(1, True), (1, False), (2, True)])
def test_fsdp1_adapters_under_reentrant_checkpointing_keep_every_layers_input_and_gradient(monkeypatch, version,
                                                                                          reenters):
    """transformers 4.x checkpoints the FSDP1 unit's __call__ reentrantly, and FSDP1's hook on each frozen layer
    unit's input keeps that input and its gradient to the end of backward: w * h * (L - 2) per token more
    (bench/measure_fsdp_activations.py). Not under FSDP2, nor with transformers 5 (it checkpoints forward)."""
    from wizard.config import answers as answers_mod
    monkeypatch.setattr(answers_mod, "_transformers_reenters_call", lambda: reenters)
    # task "base": no head output, so the layers' backward is the step's peak and the excess shows whole.
    given = {"params": "7B", "method": "lora", "backend": "fsdp", "task": "base", "gradient_checkpointing": "on",
             "seq_len": 4096, "micro_batch": 2}

    def build(extra):
        result = pipeline.build(Request(assume="2xA100-80GB,ram=1T", output_dir="/tmp/unused",
                                        given={**given, **extra}))
        return result, rung_by_key(result.plan, "fsdp-reshard")

    _, fsdp2 = build({})
    result, rung = build({"fsdp_version": version})
    delta = rung.breakdown["activations"] - fsdp2.breakdown["activations"]
    noted = any("FSDP1 with adapters" in n for n in result.plan.notes)
    if version == 1 and reenters:
        assert delta == 2 * 4096 * 2 * result.model.hidden_size * (result.model.layers - 2) and noted
    else:
        assert delta == 0 and not noted


def test_the_fsdp1_note_needs_an_fsdp_rung_to_speak_of(monkeypatch):
    """FSDP1's retained checkpoints are said only where the ladder holds an FSDP rung."""
    from wizard.config import answers as answers_mod
    monkeypatch.setattr(answers_mod, "_transformers_reenters_call", lambda: True)
    for extra, noted in (({"zero_stage": 2}, False), ({}, True)):
        result = pipeline.build(Request(assume="2xA100-80GB,ram=1T", output_dir="/tmp/unused", given={
            "params": "7B", "method": "lora", "gradient_checkpointing": "on", "fsdp_version": 1, **extra}))
        assert any(r.key.startswith("fsdp") for r in result.plan.rungs) == noted, extra
        assert any("FSDP1 with adapters" in n for n in result.plan.notes) == noted, extra


def test_choosing_fsdp1_on_the_details_screen_replans(monkeypatch):
    """fsdp_version is asked after the plan, but FSDP1 with adapters under transformers 4.x changes FSDP's memory:
    the TUI's and --plain's session re-plans with it, as a flag or answers file does."""
    from wizard.config import answers as answers_mod
    from wizard.frontends.session import WizardState
    monkeypatch.setattr(answers_mod, "_transformers_reenters_call", lambda: True)
    state = WizardState(Request(assume="2xA100-80GB", output_dir="/tmp/unused", given={
        "params": "7B", "method": "lora", "backend": "fsdp", "task": "base", "gradient_checkpointing": "on"}))
    state.set_probed(state.load_hardware())
    assert state.replan() is None
    before = rung_by_key(state.plan, "fsdp-reshard").breakdown["activations"]
    assert state.asked("fsdp_version") and state.value_of("fsdp_version") == 2
    state.set_answer("fsdp_version", 1)
    assert state.replan() is None
    after = rung_by_key(state.plan, "fsdp-reshard").breakdown["activations"]
    assert after > before and any("FSDP1 with adapters" in n for n in state.plan.notes)
    assert state.value_of("fsdp_version") == 1
