"""The rules' claims about DeepSpeed's engine and the Trainer, shown on real single-process runs in a subprocess
(DeepSpeed on the CPU over gloo; the first run JIT-builds a small op, hence slow). The claims checked on the
libraries' classes alone are in tests/unit/test_check_library_facts.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "check"
ROOT = Path(__file__).resolve().parent.parent.parent


def fixture(rule: str, kind: str, name: str) -> Path:
    return FIXTURES / rule / kind / name


def ds(rule: str, kind: str = "trigger") -> dict:
    return json.loads(fixture(rule, kind, "ds_config.json").read_text())


# ----------------------------------------------------------------------------- real engines / Trainer (subprocess)

ENGINE_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    import torch, deepspeed
    out = {}
    for name, cfg in json.loads(sys.argv[1]).items():
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        try:
            deepspeed.initialize(model=model, optimizer=opt, config=cfg)
            out[name] = "OK"
        except Exception as e:
            out[name] = type(e).__name__ + ": " + str(e)[:200]
    print("RESULT " + json.dumps(out))
""")

TRAINER_SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, vocab_size=100)
    out = {}
    for name, (ds, ta) in json.loads(sys.argv[1]).items():
        ta = {k: v for k, v in ta.items() if k not in ("bf16", "max_steps")}   # bf16 raises on a CPU box
        try:
            args = TrainingArguments(output_dir=tempfile.mkdtemp(), deepspeed=ds, report_to=[], **ta)
            Trainer(model=LlamaForCausalLM(cfg), args=args)
            out[name] = "OK"
        except Exception as e:
            out[name] = type(e).__name__ + ": " + str(e)[:200]
    print("RESULT " + json.dumps(out))
""")


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(script: str, payload: dict, timeout: int = 600) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(payload), _free_port()], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def _engine_cfg(rule: str, kind: str) -> dict:
    cfg = ds(rule, kind)
    cfg.update({"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "gradient_clipping": 1.0, "bf16": {"enabled": False}, "fp16": {"enabled": False}})
    for k, v in list(cfg["zero_optimization"].items()):
        if v == "auto":
            cfg["zero_optimization"][k] = 1000
    return cfg


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_engine_rejects_odd_allgather_bucket_and_offload_with_client_optimizer():
    """Real single-process DeepSpeed engines on CPU (gloo); the first run JIT-builds a small comm op."""
    result = _run(ENGINE_SCRIPT, {
        "odd": _engine_cfg("DS-ODD-ALLGATHER-BUCKET", "trigger"),
        "even": _engine_cfg("DS-ODD-ALLGATHER-BUCKET", "clean"),
        "offload": _engine_cfg("DS-OFFLOAD-CLIENT-OPTIMIZER", "trigger"),
    })
    assert result["odd"].startswith("AssertionError: allgather_bucket_size must be a multiple"), result
    assert result["even"] == "OK", result
    assert result["offload"].startswith("ZeRORuntimeException: You are using ZeRO-Offload with a client provided"), \
        result


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_trainer_rejects_auto_batch_size_and_save_only_model_with_zero3():
    def case(rule, kind):
        d = fixture(rule, kind, "case.json").parent
        return [json.loads((d / "ds_config.json").read_text()), json.loads((d / "training_args.json").read_text())]

    result = _run(TRAINER_SCRIPT, {
        "auto_batch": case("TRN-AUTO-BATCH-ZERO3", "trigger"),
        "auto_batch_clean": case("TRN-AUTO-BATCH-ZERO3", "clean"),
        "best": case("TRN-SAVE-ONLY-MODEL-BEST", "trigger") + [],
    })
    assert "`auto_find_batch_size` isn't supported yet with DeepSpeed Zero-3" in result["auto_batch"], result
    assert result["auto_batch_clean"] == "OK", result
    assert "DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`" in result["best"], \
        result
