"""The wizard writes nothing that its own doctor or the real libraries reject."""

from __future__ import annotations

import pytest

from wizard import pipeline
from wizard.probe.hardware import assume


def _result(tmp_path):
    req = pipeline.Request(given={"params": "7B", "backend": "deepspeed", "zero_stage": "3"},
                           output_dir=str(tmp_path / "out"))
    return pipeline.build(req, hw=assume("8xA100-80GB"))


@pytest.mark.slow
def test_a_config_with_an_error_finding_is_refused_and_nothing_is_written(tmp_path):
    result = _result(tmp_path)
    # What users get by hand-editing: mixed_precision beside deepspeed_config_file (accelerate rejects it
    # at launch) and a float bucket inside zero_optimization (DeepSpeed rejects it).
    result.yaml_text += "mixed_precision: bf16\n"
    result.ds_text = result.ds_text.replace('"sub_group_size": 1000000000', '"sub_group_size": 1000000000.5')
    pipeline.validate(result)
    rules = {f.rule for f in result.errors}
    assert result.errors, "the broken files should have error findings"
    assert any("ds" in f.file.lower() or "json" in f.file.lower() for f in result.errors)
    assert any("yaml" in f.file.lower() for f in result.errors), rules
    with pytest.raises(RuntimeError, match="refusing"):
        pipeline.write(result, {})
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_the_same_config_unbroken_passes_and_is_written(tmp_path):
    result = _result(tmp_path)
    pipeline.validate(result)
    assert not result.errors, [f"{f.rule}: {f.message}" for f in result.errors]
    writes = pipeline.write(result, {})
    assert {w.path for w in writes} >= {result.yaml_path, result.ds_path}
