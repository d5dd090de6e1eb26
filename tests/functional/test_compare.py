"""`wizard compare` (issue 32): each row is `wizard plan --assume MACHINE`; the fastest and cheapest rows are right
for the prices given; every default machine is planned or says by how much it does not fit; --write writes what
`wizard --non-interactive --assume MACHINE` writes, and the real libraries accept it; prices files and bad input."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wizard import compare as compare_mod
from wizard.frontends.cli import main

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
LLAMA_8B = str(MODELS / "llama-3.1-8b")
LLAMA_70B = str(MODELS / "llama-3-70b")

# 8B LoRA: every machine fits; 70B full fine-tuning: one node of H100s does not, two do, an H200 node offloads.
CASES = {
    "8b-lora": (["--model", LLAMA_8B, "--method", "lora"], "1xA100-40GB,1xH100-80GB,8xA100-80GB,2x8xH100-80GB"),
    "70b-full": (["--model", LLAMA_70B], "8xH100-80GB,8xH200-141GB,8xB200-180GB,2x8xH100-80GB"),
}


def cli_json(args, capsys) -> tuple[int, dict]:
    code = main(args)
    out = capsys.readouterr().out
    return code, json.loads(out)


def run(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wizard", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_agree_with_plan_assume(case, capsys):
    flags, machines = CASES[case]
    code, doc = cli_json(["compare", *flags, "--machines", machines, "--json"], capsys)
    assert code == 0
    rows = {r["machine"]: r for r in doc["rows"]}
    assert list(rows) != [] and set(rows) == set(machines.split(","))
    # issue 40: every row trains one global batch (the GPU counts' least common multiple, 16 here)
    assert doc["global_batch"] == 16 and not doc["global_batch_given"]
    assert {r["global_batch"] for r in doc["rows"] if r["fits"]} == {16}
    for label, row in rows.items():
        assume = compare_mod.machine(label).assume
        plan_code, plan = cli_json(["plan", *flags, "--assume", assume, "--global-batch", "16", "--json"], capsys)
        choice = plan["plan"]["choice"]
        assert row["fits"] == (choice is not None) == (plan_code == 0), label
        assert row["gpu_memory_bytes"] == plan["plan"]["gpu_capacity_bytes"] and row["host_ram_bytes"] > 0, label
        if choice is None:
            assert row["shortfall"] and row["short_by"] >= 1.0, label
            continue
        assert row["per_gpu_bytes"] == choice["per_gpu_bytes"], label
        assert (row["rung"], row["micro_batch"], row["grad_accum"], row["gradient_checkpointing"]) == \
            (choice["key"], choice["micro_batch"], choice["grad_accum"], choice["gradient_checkpointing"]), label
        assert row["tokens_per_second"] == pytest.approx(choice["speed"]["tokens_per_second"], rel=1e-3), label
        assert row["step_seconds"] == pytest.approx(choice["speed"]["step_seconds"], rel=1e-3), label
    if case == "70b-full":
        assert not rows["8xH100-80GB"]["fits"] and rows["2x8xH100-80GB"]["fits"]


def test_time_to_train_is_the_plans_own(capsys):
    """--train-tokens: the row's time is the plan's train_seconds for the chosen rung."""
    flags = ["--model", LLAMA_8B, "--method", "lora", "--train-tokens", "2e9"]
    _, doc = cli_json(["compare", *flags, "--machines", "8xA100-80GB", "--json"], capsys)
    _, plan = cli_json(["plan", *flags, "--assume", "8xA100-80GB", "--json"], capsys)
    assert doc["train_tokens"] == 2 * 10**9 and doc["train_tokens_given"]
    assert doc["rows"][0]["train_seconds"] == pytest.approx(plan["plan"]["choice"]["speed"]["train_seconds"], rel=1e-3)


def test_fastest_and_cheapest_for_the_prices_given(capsys):
    """Prices chosen so the fastest machine is not the cheapest: 16 H100s at 4.0 are fastest, 8 A100s at 1.0
    cheapest; the marks follow time x GPUs x price recomputed here from the rows' own speeds."""
    machines = "1xH100-80GB,8xA100-80GB,2x8xH100-80GB,4xH200"
    prices = "H100-80GB=4.0,8xA100-80GB=1.0,H200-141GB=3.0"
    code, doc = cli_json(["compare", "--model", LLAMA_8B, "--method", "lora", "--train-tokens", "1e9",
                          "--machines", machines, "--price", prices, "--sort", "cost", "--json"], capsys)
    assert code == 0
    price = {"1xH100-80GB": 4.0, "8xA100-80GB": 1.0, "2x8xH100-80GB": 4.0, "4xH200": 3.0}
    hours = {r["machine"]: 1e9 / r["tokens_per_second"] / 3600 for r in doc["rows"]}
    cost = {m: price[m] * compare_mod.machine(m).gpus * h for m, h in hours.items()}
    for r in doc["rows"]:
        assert r["cost"] == pytest.approx(cost[r["machine"]], rel=1e-2)
    assert doc["fastest"] == min(hours, key=hours.get) == "2x8xH100-80GB"
    assert doc["cheapest"] == min(cost, key=cost.get) == "8xA100-80GB"
    # by cost, a tie to the cent (linear scaling: 1 and 16 H100s) the faster first
    assert [r["machine"] for r in doc["rows"]] == sorted(cost, key=lambda m: (round(cost[m], 2), hours[m]))
    assert [r["machine"] for r in doc["rows"] if r["fastest"]] == ["2x8xH100-80GB"]
    assert [r["machine"] for r in doc["rows"] if r["cheapest"]] == ["8xA100-80GB"]


@pytest.mark.parametrize("flags", [["--model", LLAMA_70B], ["--model", LLAMA_8B, "--method", "lora"]],
                         ids=["70b-full", "8b-lora"])
def test_every_default_machine_is_planned_or_short_by_how_much(flags):
    machines = compare_mod.default_machines()
    assert len(machines) >= 30
    assert any(m.nodes == 2 for m in machines)
    given = {"model": flags[1], **({"method": "lora"} if "lora" in flags else {})}
    result = compare_mod.compare(given, machines)
    assert len(result.rows) == len(machines)
    for r in result.rows:
        assert r.error is None, (r.machine.label, r.error)
        if r.fits:
            assert r.tokens_per_second > 0 and r.train_seconds > 0 and r.rung
        else:
            assert r.short_by is not None and r.short_by >= 1.0 and r.shortfall, r.machine.label
    assert result.fastest is not None and result.fastest.fits


def test_default_set_through_the_cli_table():
    """End to end: the real CLI prints the table, the caveat once, the misses by how much, the write commands."""
    out = run(["compare", "--model", LLAMA_70B, "--max-gpus", "16"])
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    text = out.stdout
    assert text.count("`wizard tune` measures them") == 1
    assert "does not fit by" in text and "2x8xB200-180GB" in text
    assert "wizard --non-interactive --assume 8xB200-180GB --model" in text
    bounded = run(["compare", "--model", LLAMA_70B, "--max-gpus", "4", "--json"])
    assert bounded.returncode in (0, 3)
    assert all(r["gpus"] <= 4 for r in json.loads(bounded.stdout)["rows"])


def _files(d: Path) -> dict[str, str]:
    return {p.name: p.read_text().replace(str(d), "OUT") for p in sorted(d.iterdir()) if p.suffix in (".yaml", ".json")}


def test_write_is_non_interactive_assume_and_the_libraries_accept_it(tmp_path):
    """--write 2x8xH100-80GB for the 70B: DeepSpeed ZeRO-3 with CPU offload; the same files as
    `wizard --non-interactive --assume 8xH100-80GB,nodes=2`, and `wizard check` (accelerate, DeepSpeed,
    transformers) finds no error in them."""
    flags = ["--model", LLAMA_70B, "--main-process-ip", "10.0.0.1"]
    a, b = tmp_path / "compare", tmp_path / "direct"
    out = run(["compare", *flags, "--write", "2x8xH100-80GB", "--output-dir", str(a)])
    assert out.returncode == 0, out.stderr
    # the comparison's global batch (16 for the default machines: issue 40) is the row's --global-batch
    direct = run(["--non-interactive", *flags, "--assume", "8xH100-80GB,nodes=2", "--global-batch", "16",
                  "--output-dir", str(b)])
    assert direct.returncode == 0, direct.stderr
    assert (a / "ds_config.json").is_file() and (a / "default_config.yaml").is_file()
    assert _files(a) == _files(b)
    ds = json.loads((a / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 3
    check = run(["check", "--config-file", str(a / "default_config.yaml"), "--assume", "8xH100-80GB",
                 "--model", LLAMA_70B, "--json"])
    assert check.returncode == 0, check.stdout + check.stderr
    assert not [f for f in json.loads(check.stdout) if f["severity"] == "error"]


def test_write_needs_the_address_of_a_multi_machine_row(tmp_path):
    out = run(["compare", "--model", LLAMA_70B, "--write", "2x8xH100-80GB", "--output-dir", str(tmp_path / "o")])
    assert out.returncode == 2
    assert "main-process-ip" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_the_footers_suggestion_to_add_write_to_the_command_works(tmp_path, capsys):
    """Issue 36: the footer says "add --write MACHINE to this command"; on a command with --machines and prices that
    once exited 2 (--machines refused beside --write). The command as printed, plus --write and a machine of its
    table, writes that machine's files, the same as the row's own `wizard --non-interactive` line."""
    command = ["compare", "--params", "7B", "--machines", "1xH100-80GB,2x8xH100-80GB,2xA100-80GB",
               "--price", "H100-80GB=2.5", "--sort", "cost"]
    assert main(command) == 0
    text = capsys.readouterr().out
    footer = text[text.index("Write a machine's files"):].splitlines()
    assert "add --write MACHINE to this command; with --main-process-ip ADDRESS for a machine of several nodes" \
        in footer[0]
    rows = dict(line.strip().split(": ", 1) for line in footer[1:] if line.strip())
    assert "2xA100-80GB" in rows
    suggested, direct = tmp_path / "suggested", tmp_path / "direct"
    assert main([*command, "--write", "2xA100-80GB", "--output-dir", str(suggested)]) == 0
    row = rows["2xA100-80GB"].split()
    assert row[:2] == ["wizard", "--non-interactive"]
    assert main([*row[1:], "--output-dir", str(direct)]) == 0
    capsys.readouterr()
    assert _files(suggested) == _files(direct) and "default_config.yaml" in _files(suggested)
    several = [*command, "--write", "2x8xH100-80GB", "--main-process-ip", "10.0.0.1", "--dry-run"]
    assert main(several) == 0, capsys.readouterr().err


def test_prices_file_and_its_age(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("date: 2026-01-05\ncurrency: EUR\nprices:\n  8xA100-80GB: 1.5\n  H100: 2.25\n")
    prices = compare_mod.load_prices_file(str(old))
    assert prices.per_gpu_hour == {"8xA100-80GB": 1.5, "H100-80GB": 2.25} and prices.currency == "EUR"
    assert compare_mod.stale_prices_warning(prices, today=dt.date(2026, 2, 4)) is None        # 30 days
    warning = compare_mod.stale_prices_warning(prices, today=dt.date(2026, 2, 5))             # 31 days
    assert warning and "31 days" in warning and str(old) in warning
    assert prices.for_machine(compare_mod.machine("8xA100-80GB")) == 1.5
    assert prices.for_machine(compare_mod.machine("4xH100")) == 2.25
    assert prices.for_machine(compare_mod.machine("2x8xH100-80GB")) == 2.25
    assert prices.for_machine(compare_mod.machine("4xA100-80GB")) is None
    out = run(["compare", "--model", LLAMA_8B, "--method", "lora", "--machines", "8xA100-80GB,4xH100",
               "--prices", str(old)])
    assert out.returncode == 0, out.stderr
    assert "days ago (more than 30)" in out.stderr and "EUR" in out.stdout
    fresh = tmp_path / "fresh.yaml"
    fresh.write_text(f"date: {dt.date.today().isoformat()}\nprices:\n  H100-80GB: 2\n")
    out = run(["compare", "--model", LLAMA_8B, "--method", "lora", "--machines", "4xH100", "--prices", str(fresh)])
    assert out.returncode == 0 and "days ago" not in out.stderr


def _bad(tmp_path: Path) -> list[tuple[list[str], str]]:
    undated = tmp_path / "undated.yaml"
    undated.write_text("prices:\n  H100: 2\n")
    return [
        (["--sort", "size"], "sort"),
        (["--machines", "8xZ100"], "machines"),
        (["--machines", ""], "machines"),
        (["--machines", "8xH100,8xH100-80GB"], "machines"),
        (["--machines", "ram=2T"], "machines"),
        (["--price", "8xA100-80GB=abc"], "price"),
        (["--price", "H100"], "price"),
        (["--price", "Z100=2"], "price"),
        (["--max-gpus", "0"], "max-gpus"),
        (["--max-gpus", "8", "--machines", "8xH100"], "max-gpus"),
        (["--num-processes", "4"], "num-processes"),
        (["--write", "8xZ100"], "machines"),
        (["--write", "8xA100-80GB", "--machines", "8xH100"], "write"),
        (["--output-dir", str(tmp_path / "o")], "output-dir"),
        (["--prices", str(tmp_path / "missing.yaml")], "prices"),
        (["--prices", str(undated)], "prices"),
        (["--seq-len", "abc"], "seq"),
    ]


def test_bad_input_exits_2_with_one_line_naming_the_flag(tmp_path, capsys):
    for extra, field in _bad(tmp_path):
        code = main(["compare", "--model", LLAMA_8B, *extra])
        captured = capsys.readouterr()
        lines = [x for x in captured.err.splitlines() if x.strip()]
        assert code == 2, (extra, captured.err)
        assert len(lines) == 1 and lines[0].startswith("wizard: ") and field in lines[0], (extra, lines)
        assert captured.out == "", extra
    assert not (tmp_path / "o").exists()


def test_measured_machines_are_marked_and_planned_with_the_measurement(capsys):
    """A machine `wizard tune` measured (same GPUs, same count) is planned with its ratio and the row marked measured
    where the choice is the measured rung (a ratio that made it faster keeps it chosen);
    --no-calibration plans it raw. `wizard plan --assume` of that machine stays raw."""
    from wizard.planning import calibration
    from wizard.probe import hardware

    flags = ["--model", LLAMA_8B, "--method", "lora"]
    _, raw = cli_json(["compare", *flags, "--machines", "8xA100-80GB,1xH100-80GB", "--json"], capsys)
    raw_rows = {r["machine"]: r for r in raw["rows"]}
    assert not any(r["measured"] for r in raw["rows"])
    hw = hardware.assume("8xA100-80GB")
    from wizard.planning.plan_types import Topology
    calibration.record(hw, Topology(processes_per_machine=8), "lora",
                       [{"rung": raw_rows["8xA100-80GB"]["rung"], "speed_ratio": 1.25, "memory_ratio": None}],
                       model="test")
    _, cal = cli_json(["compare", *flags, "--machines", "8xA100-80GB,1xH100-80GB", "--json"], capsys)
    rows = {r["machine"]: r for r in cal["rows"]}
    assert rows["8xA100-80GB"]["measured"] and "1 trial" in rows["8xA100-80GB"]["measured"]
    assert rows["8xA100-80GB"]["tokens_per_second"] == pytest.approx(
        1.25 * raw_rows["8xA100-80GB"]["tokens_per_second"], rel=1e-2)
    assert rows["1xH100-80GB"]["measured"] is None
    assert rows["1xH100-80GB"]["tokens_per_second"] == raw_rows["1xH100-80GB"]["tokens_per_second"]
    _, off = cli_json(["compare", *flags, "--machines", "8xA100-80GB", "--no-calibration", "--json"], capsys)
    assert off["rows"][0]["measured"] is None
    assert off["rows"][0]["tokens_per_second"] == raw_rows["8xA100-80GB"]["tokens_per_second"]
    _, plan = cli_json(["plan", *flags, "--assume", "8xA100-80GB", "--json"], capsys)
    assert plan["plan"]["choice"]["speed"]["tokens_per_second"] == pytest.approx(
        raw_rows["8xA100-80GB"]["tokens_per_second"], rel=1e-3)
    text_code = main(["compare", *flags, "--machines", "8xA100-80GB"])
    assert text_code == 0 and "(measured)" in capsys.readouterr().out


def test_compare_imports_no_heavy_library():
    """A comparison of a --params model over the default set, like `wizard plan`, imports no torch & co. One GPU
    each: from 2 GPUs a 7B picks context parallelism where it is the fastest rung (2xH100: FSDP2 + cp 2), whose
    sizes accelerate's own ParallelismConfig judges as the plan is made (wizard/config/parallelism.py), importing
    torch there as `wizard plan` does."""
    code = ("import sys, runpy\nsys.argv = ['wizard', 'compare', '--params', '7B', '--max-gpus', '1', '--json']\n"
            "try:\n    runpy.run_module('wizard', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "sys.stdout.flush()\nsys.stderr.write('\\nHEAVY=' + ','.join(m for m in ('torch', 'transformers', "
            "'deepspeed', 'peft', 'textual') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = [x for x in out.stderr.splitlines() if x.startswith("HEAVY=")][-1]
    assert line == "HEAVY=", line
    assert json.loads(out.stdout)["rows"]
