"""The fused loss's memory (issue 38): DeepSpeed's TiledFusedLogitsLoss on a real transformers Llama, measured on
the CPU by bench/measure_activations.py, holds 12 B per element of one shard's logits plus the LM head's input
gradient (bench/results/fused-loss.md) where the full loss holds 12 B per element of all the logits."""

from __future__ import annotations

import pytest

from tests.bench_modules import measure_activations
from wizard.sizing import memory as mem


@pytest.fixture(scope="module")
def bench():
    return measure_activations()


SMALL = dict(hidden=128, heads=4, kv_heads=2, layers=1, vocab=4000, seq=256, batch=2, gc=True)


@pytest.mark.parametrize("shards", [1, 8])
def test_the_fused_loss_holds_one_shards_logits_and_the_input_gradient(bench, shards):
    shape = bench.Shape(fused_shards=shards, **SMALL)
    m = bench.measure(shape)
    labels = 8 * shape.batch * shape.seq          # the shifted int64 labels, left out of both figures
    assert m.loss_peak - labels == pytest.approx(bench.fused_loss_fit(shape), rel=1e-3)
    full = mem.logits_bytes(shape.seq, shape.batch, shape.vocab, shape.dtype)
    if shards == 1:               # one shard is the whole loss, plus the input gradient kept for backward
        assert m.loss_peak > full
    else:
        assert m.loss_peak < full / 4
