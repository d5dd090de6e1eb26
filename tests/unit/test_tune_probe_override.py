"""The tune probe applies a trial's split to the script's own HF TrainingArguments, without editing the script:
a real `transformers.TrainingArguments` built in a fresh interpreter after `_probe.install()`, as a rank does."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.launch_support import REPO, env

SCRIPT = r'''
import json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "launch"))
import _probe
_probe.install()
imported_by_probe = "transformers" in sys.modules
from transformers import TrainingArguments
args = TrainingArguments(output_dir=os.path.join(sys.argv[2], "own-output"), per_device_train_batch_size=4,
                         gradient_accumulation_steps=1, gradient_checkpointing=False, report_to="none", use_cpu=True)
fields = TrainingArguments.__dataclass_fields__
print("RESULT " + json.dumps({
    "imported_by_probe": imported_by_probe,
    "micro_batch": args.per_device_train_batch_size, "grad_accum": args.gradient_accumulation_steps,
    "gc": [getattr(args, n) for n in ("activation_checkpointing", "gradient_checkpointing") if n in fields],
    "output_dir": args.output_dir}))
'''


def build_args(tmp_path, **trial):
    probe_dir = tmp_path / "probe"
    e = {k: v for k, v in env().items() if not k.startswith("WIZARD_TRIAL_")}
    e.update({"WIZARD_PROBE": json.dumps({"dir": str(probe_dir), "warmup": 1, "measure": 1}), **trial})
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), str(tmp_path)], env=e, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
    records = [json.loads(x) for x in (probe_dir / "rank-0.jsonl").read_text().splitlines()]
    return json.loads(line[len("RESULT "):]), [x for x in records if x.get("training_args")]


def test_the_trials_split_overrides_the_scripts_training_arguments(tmp_path):
    got, (record,) = build_args(tmp_path, WIZARD_TRIAL_MICRO_BATCH="32", WIZARD_TRIAL_GRAD_ACCUM="3",
                                WIZARD_TRIAL_GC="1")
    assert not got["imported_by_probe"]               # the probe waits for the script's own import
    assert (got["micro_batch"], got["grad_accum"]) == (32, 3) and got["gc"] and all(got["gc"]), got
    assert got["output_dir"] == str(tmp_path / "probe" / "output_dir")
    assert record["applied"] is True
    assert record["own"] == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                             "gradient_checkpointing": False}
    assert record["set"] == {"per_device_train_batch_size": 32, "gradient_accumulation_steps": 3,
                             "gradient_checkpointing": True}
    assert record["now"] == record["set"]


def test_without_the_trial_variables_nothing_changes_but_it_is_recorded(tmp_path):
    got, (record,) = build_args(tmp_path)
    assert (got["micro_batch"], got["grad_accum"]) == (4, 1) and not any(got["gc"]), got
    assert record["applied"] is False and record["set"] == {}
    assert record["now"] == record["own"] == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
                                              "gradient_checkpointing": False}
