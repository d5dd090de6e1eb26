"""The premise of the plan's loading peak for sharded QLoRA (Rung.load_bytes, lora.qlora_load_gpu_bytes), run with
the installed transformers and bitsandbytes: under accelerate's FSDP environment with cpu_ram_efficient_loading,
from_pretrained leaves the whole NF4 model on every rank, not only on local rank 0. A transformers that loads a
quantised model on rank 0 alone would make that peak, and "70B QLoRA does not fit on 2x24 GB", wrong: this fails
then, and the plan must follow it."""

from __future__ import annotations

import pytest

pytest.importorskip("bitsandbytes")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_rank_holds_the_whole_nf4_model_after_from_pretrained_under_fsdp():
    from bench.measure_qlora_loading import measure
    rank0, rank1 = measure(hidden=256, layers=2)
    assert rank0["fsdp_enabled"] and rank1["fsdp_enabled"]          # transformers' own is_fsdp_enabled()
    assert rank1["nf4"]["meta"] == 0 and rank1["nf4"]["device"] == rank0["nf4"]["device"] > 0
    assert rank1["nf4_quantised_layers"] == rank0["nf4_quantised_layers"] == 2 * 7
