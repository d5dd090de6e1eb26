"""`wizard --plain`: the questionary flow driven without a terminal, through prompt_toolkit's pipe
input and DummyOutput, from the hardware question to the written, validated files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from wizard import pipeline
from wizard.errors import EXIT_INTERRUPTED
from wizard.frontends.prompts import CANCELLED, run_plain
from wizard.pipeline import Request
from wizard.probe import hardware

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
NO_GPU = str(ROOT / "snapshots" / "hardware" / "no-gpu.json")
ENTER, DOWN, BACKSPACE, CTRL_C = "\r", "\x1b[B", "\x7f", "\x03"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    monkeypatch.setenv("WIZARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "wizard_cache"))


def plain(request: Request, keys: str, capsys=None) -> int:
    """Run the plain wizard with these keystrokes queued (prompt_toolkit keeps typeahead between prompts)."""
    with create_pipe_input() as pipe:
        pipe.send_text(keys)
        return run_plain(request, input=pipe, output=DummyOutput())


def prompts_before_the_plan(request: Request) -> int:
    """How many questions the plain flow asks before showing the plan (model and training)."""
    from wizard.config.questions import for_stage
    from wizard.frontends.session import WizardState
    state = WizardState(request)
    state.set_probed(state.load_hardware())
    state.replan()
    return sum(1 for stage in ("model", "training") for q in for_stage(stage)
               if not q.advanced and state.asked(q.id))


def prompts_until_write(request: Request) -> int:
    """Prompts before "Write these files?" when every default is taken: model and training, Next, then
    machines and details for the plan's choice."""
    from wizard.config.questions import for_stage
    from wizard.frontends.session import WizardState
    state = WizardState(request)
    state.set_probed(state.load_hardware())
    job = state.replan()
    while job is not None:
        job = state.sized(job.model, pipeline.size_for_plan(job.model, job.trainings), None)
    details = sum(1 for stage in ("machines", "details") for q in for_stage(stage)
                  if not q.advanced and state.asked(q.id))
    return prompts_before_the_plan(request) + 1 + details


def same_as_non_interactive(request: Request, out: Path, given: dict) -> None:
    """Enter on every prompt gives the files `wizard --non-interactive` writes for the same flags."""
    expected = pipeline.build(Request(given=given, hardware_file=request.hardware_file, assume=request.assume,
                                      output_dir=str(out)))
    assert (out / "default_config.yaml").read_text() == expected.yaml_text
    if expected.ds_text is None:
        assert not (out / "ds_config.json").exists()
    else:
        assert (out / "ds_config.json").read_text() == expected.ds_text


def test_enter_on_every_prompt_writes_what_non_interactive_writes(tmp_path, capsys):
    out = tmp_path / "out"
    model = str(MODELS / "llama-3.1-8b")
    request = Request(given={"model": model}, assume="8xA100-80GB", output_dir=str(out))
    assert plain(request, ENTER * 80) == 0
    printed = capsys.readouterr().out
    assert "=> DeepSpeed ZeRO-2" in printed                 # wizard.frontends.report.print_plan
    assert "Validated with accelerate, DeepSpeed and transformers: OK" in printed
    assert "TrainingArguments(" in printed and "deepspeed=" in printed
    same_as_non_interactive(request, out, {"model": model})
    assert json.loads((out / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2


def test_no_gpu_enter_through_writes_a_cpu_configuration(tmp_path, capsys):
    out = tmp_path / "out"
    request = Request(hardware_file=NO_GPU, output_dir=str(out))
    assert plain(request, ENTER * 80) == 0
    doc = yaml.safe_load((out / "default_config.yaml").read_text())
    assert doc["num_processes"] == 2
    # The same as the flags that say the same: CPU processes, 2 of them, the recommended 125M model.
    same_as_non_interactive(request, out, {"use_cpu": True, "num_processes": 2, "params": "125M"})


def test_no_gpu_plan_for_a_catalogue_machine(tmp_path):
    out = tmp_path / "out"
    request = Request(hardware_file=NO_GPU, output_dir=str(out))
    keys = (DOWN + ENTER                      # plan for another machine
            + BACKSPACE + "4" + ENTER         # 4 GPUs (default 8)
            + ENTER                           # H100-80GB, the default GPU model
            + ENTER * 80)
    assert plain(request, keys) == 0
    doc = yaml.safe_load((out / "default_config.yaml").read_text())
    assert doc["num_processes"] == 4 and doc["distributed_type"] == "DEEPSPEED"
    # What --assume 4xH100-80GB writes with the recommended 7B parameter count.
    same_as_non_interactive(Request(assume="4xH100-80GB", output_dir=str(out)), out, {"params": "7B"})


def test_invalid_entries_are_refused_at_the_prompt(tmp_path):
    out = tmp_path / "out"
    model = str(MODELS / "qwen2.5-7b")
    # a refused entry is asked again as the question was first asked (its default), never with the refused text
    keys = (BACKSPACE * len(model) + str(MODELS / "no-config") + ENTER     # no config.json: refused
            + ENTER                                                        # asked again with the model given
            + BACKSPACE * 4 + "abc" + ENTER                                # seq_len: letters refused
            + BACKSPACE * 4 + "4096" + ENTER
            + BACKSPACE + "0" + ENTER                                      # micro-batch 0 refused
            + BACKSPACE + "2" + ENTER
            + ENTER * 80)
    request = Request(given={"model": model}, assume="8xA100-80GB", output_dir=str(out))
    assert plain(request, keys) == 0
    record = json.loads((out / "wizard_plan.json").read_text())
    assert record["given"]["seq_len"] == 4096 and record["given"]["micro_batch"] == 2
    assert record["given"]["model"] == model
    same_as_non_interactive(request, out, {"model": model, "seq_len": 4096, "micro_batch": 2})


def test_declining_the_plan_asks_the_strategy_again(tmp_path):
    out = tmp_path / "out"
    model = str(MODELS / "qwen2.5-7b")
    request = Request(given={"model": model}, assume="8xA100-80GB", output_dir=str(out))
    first_pass = ENTER * prompts_before_the_plan(request)
    keys = (first_pass
            + DOWN + ENTER                    # not ZeRO-2: change the strategy
            + ENTER                           # backend: deepspeed, the plan's choice
            + DOWN + ENTER                    # ZeRO stage 3 (the plan's choice, 2, is the default)
            + ENTER * 3                       # offload none (the plan's), NVMe path none, headroom 0.1
            + ENTER                           # use ZeRO-3
            + ENTER * 60)
    assert plain(request, keys) == 0
    ds = json.loads((out / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    same_as_non_interactive(request, out, {"model": model, "backend": "deepspeed", "zero_stage": "3",
                                           "offload": "none"})


def test_ctrl_c_cancels_and_leaves_files_alone(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "default_config.yaml").write_text("keep: me\n")
    request = Request(given={"model": str(MODELS / "llama-3.1-8b")}, assume="8xA100-80GB", output_dir=str(out))
    assert plain(request, ENTER * 3 + CTRL_C) == EXIT_INTERRUPTED
    assert CANCELLED in capsys.readouterr().err
    assert (out / "default_config.yaml").read_text() == "keep: me\n"
    assert sorted(p.name for p in out.iterdir()) == ["default_config.yaml"]


def test_dry_run_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    request = Request(given={"model": str(MODELS / "llama-3.1-8b")}, assume="8xA100-80GB",
                      output_dir=str(out), dry_run=True)
    assert plain(request, ENTER * 80) == 0
    assert "Dry run: nothing written" in capsys.readouterr().out
    assert not out.exists()


def test_no_gpu_hardware_is_described(tmp_path, capsys):
    hw = hardware.load_file(NO_GPU)
    assert not hw.gpus
    request = Request(hardware_file=NO_GPU, output_dir=str(tmp_path / "out"), dry_run=True)
    assert plain(request, ENTER * 80) == 0
    printed = capsys.readouterr().out
    assert "GPUs: none (NVML Shared Library Not Found" in printed and "CPU processes" in printed


def test_the_plan_comes_first_and_one_answer_can_be_changed_by_name(tmp_path, capsys):
    """Issue 13: the plan is printed before any strategy question; "Change one answer" goes straight to
    the question picked by name (here the sequence length) and plans again."""
    from wizard.config.questions import for_stage
    from wizard.frontends.session import WizardState
    out = tmp_path / "out"
    model = str(MODELS / "qwen2.5-7b")
    request = Request(given={"model": model}, assume="8xA100-80GB", output_dir=str(out))
    state = WizardState(request)
    state.set_probed(state.load_hardware())
    state.replan()
    names = [q.id for stage in ("model", "training", "strategy") for q in for_stage(stage)
             if not q.advanced and state.asked(q.id)]
    keys = (ENTER * prompts_before_the_plan(request)
            + DOWN * 2 + ENTER                               # Next: change one answer
            + DOWN * names.index("seq_len") + ENTER          # Which answer? the sequence length
            + BACKSPACE * 4 + "8192" + ENTER
            + ENTER * 60)                                   # use the new plan, details, write
    assert plain(request, keys) == 0
    printed = capsys.readouterr().out
    assert printed.count("Choice:") >= 2 or printed.count("=> ") >= 2     # planned twice
    record = json.loads((out / "wizard_plan.json").read_text())
    assert record["given"]["seq_len"] == 8192 and "backend" not in record["given"]
    same_as_non_interactive(request, out, {"model": model, "seq_len": 8192})


def test_plain_asks_before_writing_and_yes_skips_it(tmp_path, capsys):
    out = tmp_path / "out"
    request = Request(given={"model": str(MODELS / "llama-3.1-8b")}, assume="8xA100-80GB", output_dir=str(out))
    with create_pipe_input() as pipe:
        pipe.send_text(ENTER * prompts_until_write(request) + "n")   # every default, then "Write these files?" no
        code = run_plain(request, input=pipe, output=DummyOutput())
    assert code == 0 and not (out / "default_config.yaml").exists()        # a choice, not an interrupt (issue 36)
    printed = capsys.readouterr().out
    assert "default_config.yaml: new file" in printed and "Sizing" in printed
    with create_pipe_input() as pipe:
        pipe.send_text(ENTER * 60)
        assert run_plain(request, input=pipe, output=DummyOutput(), yes=True) == 0
    assert (out / "default_config.yaml").exists()
    capsys.readouterr()
    with create_pipe_input() as pipe:                  # the same answers again: nothing would change
        pipe.send_text(ENTER * prompts_until_write(request) + "n")
        assert run_plain(request, input=pipe, output=DummyOutput()) == 0
    printed = capsys.readouterr().out
    assert "Quit; nothing written." in printed
    assert f"{out / 'default_config.yaml'}: unchanged" in printed and "new file" not in printed


def test_another_machines_ram_is_asked_with_the_catalogues_default(tmp_path, capsys):
    out = tmp_path / "out"
    request = Request(hardware_file=NO_GPU, output_dir=str(out))
    keys = (DOWN + ENTER                       # plan for another machine
            + BACKSPACE + "4" + ENTER          # 4 GPUs
            + ENTER                            # H100-80GB
            + BACKSPACE * 10 + "1T" + ENTER    # RAM (default: the catalogue's)
            + BACKSPACE * 4 + "48" + ENTER     # CPU cores
            + "3T" + ENTER                     # free disk
            + ENTER * 80)
    assert plain(request, keys) == 0
    printed = capsys.readouterr().out                       # the plan's Hardware line names the machine
    assert "RAM 1.0 TiB [assume:4xH100-80GB,ram=1024GiB,cpus=48,disk=3072GiB]" in printed


def test_answers_piped_to_plain_are_refused_and_the_message_says_how_a_script_answers(tmp_path):
    """Issue 21, point 7: `--yes` said "for scripts that feed the answers", yet --plain refuses a pipe. Answers
    fed by position would land on other questions as soon as the plan changes which ones are asked, so a
    script names them: --non-interactive --answers FILE. The message says so, --help too, and that works."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "WIZARD_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "out"
    common = ["--assume", "8xA100-80GB", "--output-dir", str(out)]
    piped = subprocess.run([sys.executable, "-m", "wizard", "--plain", "--yes", "--params", "7B", *common],
                           input="\n" * 60, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert piped.returncode == 2 and not out.exists()
    assert len(piped.stderr.strip().splitlines()) == 1, piped.stderr
    assert "`wizard --non-interactive --answers FILE`" in piped.stderr
    helped = subprocess.run([sys.executable, "-m", "wizard", "--help"], capture_output=True, text=True,
                            timeout=120, env={**env, "COLUMNS": "250"}, cwd=ROOT).stdout
    yes_help = " ".join(helped[helped.index("--yes, -y"):].split())
    assert "scripts that feed" not in yes_help and "--non-interactive --answers FILE" in yes_help[:300]
    answers = tmp_path / "answers.yaml"
    answers.write_text("params: 7B\nseq_len: 4096\n")
    scripted = subprocess.run([sys.executable, "-m", "wizard", "--non-interactive", "--answers", str(answers),
                               *common], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300,
                              env=env, cwd=ROOT)
    assert scripted.returncode == 0, scripted.stderr
    assert (out / "default_config.yaml").exists()


def test_a_global_batch_reaches_the_plan_the_training_arguments_and_the_files(tmp_path, capsys):
    """--plain with a global batch of 64 on 8 x A100: the plan prints the split it runs and the time to train, and
    the TrainingArguments carry that split (they said micro-batch 1 x 1 before: a batch of 8)."""
    out = tmp_path / "out"
    given = {"model": str(MODELS / "llama-3.1-8b"), "global_batch": 64, "train_tokens": "1e9", "trainer": "accelerate"}
    request = Request(given=given, assume="8xA100-80GB", output_dir=str(out))
    assert plain(request, ENTER * 80) == 0
    printed = capsys.readouterr().out
    expected = pipeline.build(Request(given=given, assume="8xA100-80GB", output_dir=str(out)))
    b = expected.plan.batch
    assert b.applied and b.micro_batch * b.grad_accum * 8 == 64 and b.micro_batch > 1
    # Enter on the micro-batch prompt accepts the split the plan shows there, so the plan is then the same split
    # as given: the same figures either way.
    assert (f"Batch: micro-batch {b.micro_batch} x accumulation {b.grad_accum} x 8 processes" in printed
            or f"global batch of 64: --micro-batch {b.micro_batch} --grad-accum {b.grad_accum}" in printed)
    from wizard.frontends.report import speed_lines
    for line in speed_lines(expected.plan):
        if line.startswith(("Speed:", "Time to train")):
            assert line in printed
    assert f"per_device_train_batch_size={b.micro_batch}," in printed
    assert f"gradient_accumulation_steps={b.grad_accum}," in printed
    same_as_non_interactive(request, out, given)
    assert json.loads((out / "ds_config.json").read_text())["gradient_accumulation_steps"] == b.grad_accum


def test_plain_asks_fsdp2s_parallelism_config_and_fp8_and_writes_what_non_interactive_writes(tmp_path):
    """accelerate 1.16's questions in --plain: on H100s planned from here, FSDP2 with a context-parallel size and fp8
    given as flags; Enter on every prompt (use the parallelism config, the sizes, the fp8 backend and its settings
    among them) writes the same files as --non-interactive, with both sections."""
    out = tmp_path / "out"
    given = {"model": str(MODELS / "llama-3.1-8b"), "backend": "fsdp", "parallelism_config_cp_size": "2",
             "mixed_precision": "fp8"}
    request = Request(given=given, assume="8xH100-80GB", output_dir=str(out))
    assert plain(request, ENTER * 80) == 0
    same_as_non_interactive(request, out, given)
    written = yaml.safe_load((out / "default_config.yaml").read_text())
    assert written["parallelism_config"]["parallelism_config_dp_shard_size"] == 4
    assert written["fp8_config"]["backend"] == "AO"
    assert written["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is False


@pytest.mark.parametrize("source, offered", [("assume", False), ("file", False), ("probe", True)])
def test_measure_is_offered_only_for_a_plan_of_this_machine(source, offered):
    """Issue 36, item 11: --plain offered Measure for an assumed machine, then refused it ("Measuring runs trials
    on this machine"). The menu follows the TUI's own test (session.measure_unavailable)."""
    import dataclasses

    from wizard.frontends.prompts import next_actions
    from wizard.frontends.session import WizardState
    hw = hardware.assume("8xA100-80GB")
    if source != "assume":
        hw = dataclasses.replace(hw, source="probe" if source == "probe" else "file:probe.json")
    state = WizardState(Request(given={"params": "7B"}), hardware=hw)
    state.replan()
    assert state.plan is not None and state.plan.choice is not None
    assert ("measure" in [value for value, _ in next_actions(state)]) == offered
