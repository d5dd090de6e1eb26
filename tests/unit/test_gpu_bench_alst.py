"""The GPU bench's ALST series (issue 38; bench/gpu/alst.py, measure.py --alst) on the CPU: the cases and their
predictions from the real pipeline, the commands, and ALST's techniques (DeepSpeed's own code) against the plain
model on a tiny Llama: the same loss and gradients, so the GPU run measures the technique and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench.gpu import alst
from bench.gpu.cases import Planner, alst_cases, write_models
from bench.gpu.environment import blocking
from bench.gpu.memory_check import train_command

pytestmark = pytest.mark.bench    # the GPU bench's own harness: CI runs it with the newest libraries only (.ci/run)

GPU_DIR = Path(__file__).resolve().parents[2] / "bench" / "gpu"


@pytest.fixture(scope="module")
def cases_cfg():
    return json.loads((GPU_DIR / "cases.json").read_text())


def test_techniques_parse_in_order_and_a_typo_is_refused():
    assert alst.parse("tiled-mlp+fused-loss") == ("fused-loss", "tiled-mlp")
    assert alst.parse("") == () and alst.parse(None) == ()
    with pytest.raises(ValueError, match="fused-los"):
        alst.parse("fused-los")


def test_shard_counts_follow_arctictraining_and_tiledmlps_example():
    # Llama-3's vocabulary at 16k tokens: 16384 * 128256 * 4 B = 7.8 GiB of fp32 logits -> 8 shards of ~1 GiB
    assert alst.fused_loss_shards(16384, 128256) == 8
    assert alst.fused_loss_shards(100, 1000) == 1
    assert alst.tiled_mlp_shards(16384, 3072) == 6 and alst.tiled_mlp_shards(10, 3072) == 1


def test_the_series_is_the_baseline_then_one_technique_more_each_predicted_by_the_same_rung(tmp_path, cases_cfg):
    from wizard.probe import hardware
    cases = alst_cases(cases_cfg)
    assert [c.alst for c in cases] == ["none", "fused-loss", "fused-loss+tiled-mlp",
                                       "fused-loss+tiled-mlp+ckpt-offload"]
    assert {c.role for c in cases} == {"alst"} and len({c.key() for c in cases}) == 4
    assert all(c.gc for c in cases)      # the checkpoint offload needs checkpointing; the baseline has it too
    model_dirs = write_models(json.loads((GPU_DIR / "models.json").read_text()), tmp_path)
    planner = Planner(hardware.assume("1xH200,ram=128G,cpus=16"), model_dirs)
    preds = [planner.predict(c) for c in cases]
    assert len({p.per_gpu_bytes for p in preds}) == 1      # the plan counts none of the techniques yet
    p = preds[0]
    assert p.rung == "single" and p.fits and p.step_seconds > 0
    # the full logits are the share the fused loss removes: 16384 x 128256 x 12 B
    assert p.breakdown["logits"] == 16384 * 128256 * 12


def test_alst_cases_need_deepspeed_and_pass_their_techniques(tmp_path, cases_cfg):
    none, fused = alst_cases(cases_cfg)[:2]
    assert blocking(["deepspeed"], none.backend, none.method, none.alst) == []
    assert blocking(["deepspeed"], fused.backend, fused.method, fused.alst) == ["deepspeed"]
    cmd = train_command(fused, "/m", 3, tmp_path, None, False, 0)
    assert cmd[cmd.index("--alst") + 1] == "fused-loss"
    assert "--alst" in train_command(none, "/m", 3, tmp_path, None, False, 0)   # non-reentrant checkpointing too
    assert fused.kind != none.kind          # a --quick dry run trains each technique once


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).float()


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_the_fused_loss_is_transformers_loss_with_the_same_gradients():
    model = tiny_llama()
    ids = torch.randint(0, 96, (2, 24), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[0, :5] = -100                 # prompt tokens: shards hold different numbers of labelled tokens
    full = model(input_ids=ids, labels=labels).loss
    full.backward()
    expected = grads(model)
    model.zero_grad()
    fused = alst.fused_causal_lm_loss(model, model.get_decoder()(input_ids=ids).last_hidden_state, labels, shards=5)
    fused.backward()
    assert fused.item() == pytest.approx(full.item(), rel=1e-6)
    got = grads(model)
    assert got.keys() == expected.keys()
    for name, g in expected.items():
        torch.testing.assert_close(got[name], g, rtol=1e-5, atol=1e-6, msg=name)


def test_the_tiled_mlp_gives_the_same_output_and_gradients():
    model, tiled = tiny_llama(), tiny_llama()
    assert alst.tile_mlps(tiled) == 2
    ids = torch.randint(0, 96, (1, 80), generator=torch.Generator().manual_seed(2))   # 80 tokens / h 32: 3 shards
    a, b = model(input_ids=ids, labels=ids).loss, tiled(input_ids=ids, labels=ids).loss
    a.backward()
    b.backward()
    assert b.item() == pytest.approx(a.item(), rel=1e-6)
    for name, g in grads(model).items():
        torch.testing.assert_close(grads(tiled)[name], g, rtol=1e-5, atol=1e-6, msg=name)
