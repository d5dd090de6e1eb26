"""A multi-machine accelerate YAML without the main machine's address (issue 27: it passed `wizard check` as
clean, though the wizard refuses to write one): one error naming the key, never a second finding from
accelerate's own assertion."""

from __future__ import annotations

from pathlib import Path

import pytest

from wizard.check.doctor import check_texts
from wizard.frontends.check_cli import main as check_main
from wizard.probe.hardware import assume

pytestmark = pytest.mark.timeout(300)

TWO_MACHINES = ("compute_environment: LOCAL_MACHINE\ndistributed_type: {dtype}\nmachine_rank: 0\n"
                "main_training_function: main\nmixed_precision: bf16\nnum_machines: 2\nnum_processes: 16\n"
                "rdzv_backend: static\nsame_network: true\nuse_cpu: {cpu}\n")


def _two(dtype: str = "MULTI_GPU", cpu: bool = False, **extra) -> str:
    text = TWO_MACHINES.format(dtype=dtype, cpu=str(cpu).lower())
    return text + "".join(f"{k}: {v}\n" for k, v in extra.items())


def _found(text: str) -> list[tuple[str, str, str | None]]:
    return [(f.rule, f.severity, f.key) for f in check_texts(text, hardware=assume("8xA100-80GB"), versions={},
                                                              port_in_use=lambda port: False)]


@pytest.mark.parametrize("dtype", ["MULTI_GPU", "FSDP"])
def test_two_machines_without_main_process_ip_is_one_error_naming_the_key(dtype):
    # torchrun then gets rdzv_endpoint 'None:29500' and retries resolving the host 'None' until its timeout
    text = _two(dtype) + ("fsdp_config:\n  fsdp_version: 2\n  fsdp_state_dict_type: SHARDED_STATE_DICT\n"
                          if dtype == "FSDP" else "")
    found = check_texts(text, hardware=assume("8xA100-80GB"), versions={}, port_in_use=lambda port: False)
    assert [(f.rule, f.severity, f.key) for f in found] == [("ACC-MAIN-PROCESS-UNSET", "error", "main_process_ip")]
    assert "main_process_ip" in found[0].fix


def test_the_cli_exits_1_for_it(tmp_path: Path, capsys):
    cfg = tmp_path / "default_config.yaml"
    cfg.write_text(_two())
    assert check_main(["--config-file", str(cfg), "--assume", "8xA100-80GB"]) == 1
    assert "main_process_ip" in capsys.readouterr().out


def test_accelerates_own_assertion_is_not_a_second_finding():
    # The simple launcher (MULTI_CPU, use_cpu) asserts "When using multiple machines, you need to specify the
    # main process IP.": ACC-LAUNCH-REJECTS sees it too, and must give way to the rule's finding.
    # ... and it asserts the port next (both named at once); the torchrun launchers default it to 29500 instead
    assert _found(_two("MULTI_CPU", cpu=True)) == [("ACC-MAIN-PROCESS-UNSET", "error", "main_process_ip"),
                                                   ("ACC-MAIN-PROCESS-UNSET", "error", "main_process_port")]
    assert _found(_two("MULTI_CPU", cpu=True, main_process_ip="10.0.0.1")) == \
        [("ACC-MAIN-PROCESS-UNSET", "error", "main_process_port")]
    assert _found(_two("MULTI_CPU", cpu=True, main_process_ip="10.0.0.1", main_process_port=29500)) == []


def test_torchrun_launchers_default_the_port_and_deepspeeds_runner_finds_the_main_node():
    assert _found(_two(main_process_ip="10.0.0.1")) == []
    # pdsh (accelerate's default multi-node launcher for DeepSpeed) takes the first host of the hostfile
    ds = ("deepspeed_config:\n  deepspeed_multinode_launcher: pdsh\n  deepspeed_hostfile: /job/hostfile\n"
          "  zero_stage: 2\n  gradient_accumulation_steps: 1\n")
    assert _found(_two("DEEPSPEED").replace("mixed_precision: bf16\n", "") + ds) == []
    # its "standard" launcher is torchrun again
    standard = ds.replace("pdsh", "standard")
    assert _found(_two("DEEPSPEED").replace("mixed_precision: bf16\n", "") + standard) == \
        [("ACC-MAIN-PROCESS-UNSET", "error", "main_process_ip")]


def test_one_machine_needs_no_address():
    assert _found(_two().replace("num_machines: 2", "num_machines: 1").replace("num_processes: 16",
                                                                              "num_processes: 8")) == []
