"""What the training script must do for a long-sequence plan (issue 38): the TrainingArguments turn Liger on where a
file can, and the lines printed for what only code can do run (the tiled loss and the checkpoint offload are run
here on the CPU with a tiny Llama, against transformers' own loss)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wizard.config import script_settings
from wizard.frontends import snippets
from wizard.planning.plan import StrategyOptions, Topology, TrainingOptions, make_plan
from wizard.probe import hardware
from wizard.sizing.model import ModelShape

LLAMA31_8B = ModelShape(params=8_030_261_248, largest_layer_params=128_256 * 4096, hidden_size=4096, layers=32,
                        heads=32, kv_heads=8, vocab_size=128_256, intermediate_size=14_336, model_type="llama",
                        layer_class="LlamaDecoderLayer")


def plan(seq: int, **training):
    hw = hardware.assume("8xH100-80GB")
    return make_plan(hw, LLAMA31_8B, TrainingOptions(seq_len=seq, **training), StrategyOptions(), Topology(1, 8))


def test_liger_is_turned_on_in_the_training_arguments_and_transformers_accepts_them():
    from transformers import TrainingArguments

    p = plan(65536)
    kwargs = snippets.training_arguments({}, p, "/cfg/ds_config.json")
    assert kwargs["use_liger_kernel"] is True
    assert "use_liger_kernel" not in snippets.training_arguments({}, plan(2048), None)
    # the installed transformers knows the fields written (on this CPU box, without the GPU precision flags)
    TrainingArguments(output_dir="out", use_cpu=True, use_liger_kernel=kwargs["use_liger_kernel"],
                      liger_kernel_config={"swiglu": False})
    assert any("use_liger_kernel=True" in line for line in snippets.script_requirements(p, {}, LLAMA31_8B))


def test_a_ulysses_plan_says_what_the_script_must_carry():
    p = plan(1048576)
    assert p.choice.sp_size > 1
    text = " ".join(snippets.script_requirements(p, {}, LLAMA31_8B))
    assert "position_ids" in text and f"pad_to_multiple_of={p.choice.sp_size}" in text and "'sdpa'" in text
    # under the HF Trainer nothing else: no lines to add
    assert snippets.script_code(p, {}, LLAMA31_8B) == ""
    # a custom loop averages the loss over the group itself
    loop = snippets.script_code(p, {"trainer": "accelerate"}, LLAMA31_8B)
    assert "_get_sequence_parallel_group" in loop and "all_reduce" in loop and "AutoLigerKernelForCausalLM" in loop
    compile(loop, "<loop>", "exec")


def test_the_code_options_print_lines_that_compile_and_turn_on_what_they_need():
    p = plan(1 << 21, allow_code_changes=True, loss="tiled")
    c = p.choice
    assert c.checkpoint_offload and c.tiled_mlp
    code = snippets.script_code(p, {}, LLAMA31_8B)
    compile(code, "<code>", "exec")
    assert "modeling.LlamaMLP.forward = tiled_mlp_forward" in code and "TiledFusedLogitsLoss" in code
    assert "save_on_cpu" in code
    from transformers import TrainingArguments

    kwargs = snippets.training_arguments({}, p, None)
    name = script_settings.checkpointing_argument() + "_kwargs"
    assert kwargs[name] == {"use_reentrant": True}
    TrainingArguments(output_dir="out", use_cpu=True, **{name: kwargs[name]})


def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=256)
    return LlamaForCausalLM(config).train()


@pytest.mark.parametrize("offload", [False, True])
def test_the_printed_tiled_loss_equals_transformers_loss_on_the_cpu(offload):
    """The HF Trainer subclass the plan prints for --loss tiled (one process: no Ulysses group), run as printed:
    its loss and the model's gradients are transformers' own."""
    import torch

    p = plan(1 << 21, allow_code_changes=True, loss="tiled")
    p.choice = replace(p.choice, sp_size=1, tiled_mlp=False, checkpoint_offload=offload)
    code = snippets.script_code(p, {}, LLAMA31_8B)
    namespace = {"Trainer": object}
    exec(compile(code, "<printed>", "exec"), namespace)
    model = _tiny_llama()
    ids = torch.randint(0, 1000, (1, 96))
    labels = ids.clone()
    labels[:, :10] = -100
    reference = model(input_ids=ids, labels=labels).loss
    reference.backward()
    expected = [q.grad.clone() for q in model.parameters()]
    model.zero_grad()
    loss = namespace["LongSequenceTrainer"]().compute_loss(model, {"input_ids": ids, "labels": labels})
    loss.backward()
    assert torch.allclose(loss, reference, atol=1e-5)
    assert all(torch.allclose(q.grad, e, atol=1e-5) for q, e in zip(model.parameters(), expected))
