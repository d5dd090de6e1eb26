"""Issue 36 item 9: `--main-process-port` on one machine is honoured, not dropped ("Given but not used"): written into
default_config.yaml, where `accelerate launch` itself (its own argument handling, run here) passes it to torchrun as
master_port for one machine too, so the Done screen's and the CLI's `accelerate launch --config_file ...` and `wizard
launch` use it alike. A single process (no torchrun) meets on no port: not written, and the note says so."""

from __future__ import annotations

import pytest
import yaml

from wizard import pipeline
from wizard.config import validate
from wizard.pipeline import Request

pytestmark = pytest.mark.timeout(180)


def _result(tmp_path, assume: str, **given):
    result = pipeline.build(Request(assume=assume, output_dir=str(tmp_path),
                                    given={"params": "1B", **given}))
    return result


@pytest.mark.parametrize("backend", ["ddp", "deepspeed", "fsdp"])
def test_a_given_port_on_one_machine_is_in_the_yaml_and_accelerate_launch_uses_it(tmp_path, backend):
    result = _result(tmp_path, "2xA100-80GB", main_process_port=29612, backend=backend)
    assert not [n for n in result.plan.notes if n.startswith("Given but not used")], result.plan.notes
    assert result.accelerate_doc["num_machines"] == 1 and result.accelerate_doc["main_process_port"] == 29612
    path = tmp_path / "default_config.yaml"
    text = result.yaml_text
    if result.ds_text is not None:
        (tmp_path / "ds_config.json").write_text(result.ds_text)
    path.write_text(text)
    launched = validate.accelerate_launch(str(path), planned_gpus=True)
    assert launched.error is None, launched.error
    # accelerate's own launch handling: the config's port becomes torchrun's master port on one machine
    assert int(launched.args.main_process_port) == 29612 and launched.args.master_port == "29612"


def test_without_a_port_one_machine_writes_none_as_accelerate_config_does(tmp_path):
    result = _result(tmp_path, "2xA100-80GB")
    assert "main_process_port" not in result.accelerate_doc
    assert "main_process_port" not in yaml.safe_load(result.yaml_text)


def test_a_single_process_says_the_port_is_not_written(tmp_path):
    result = _result(tmp_path, "1xA100-80GB", main_process_port=29612)
    assert result.accelerate_doc["distributed_type"] == "NO"
    assert "main_process_port" not in result.accelerate_doc
    assert any("--main-process-port 29612 is not written" in n for n in result.notes), result.notes
