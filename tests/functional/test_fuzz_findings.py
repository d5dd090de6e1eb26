"""The fuzz pass's findings (issue 42 items 1, 2, 3 and 6), each pinned with the input that broke it: a lone
surrogate in a checked file or a prices file, a network speed that is not a network, a DeepSpeed JSON of thousands
of unknown keys, and a model config whose num_labels would build a label map of 10^45 entries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wizard.frontends import cli

SURROGATE_DS = '{"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1, "x\\ud800": 1}'


def run(args, capsys) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


# ---- 1. any string prints -----------------------------------------------------------------------

def test_a_lone_surrogate_in_a_ds_config_key_is_printed_escaped_not_a_traceback(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(SURROGATE_DS)
    code, out, _ = run(["check", "--ds-config", str(path)], capsys)
    assert code in (0, 1)
    assert "x\\ud800" in out and "DS-UNKNOWN-TOP-KEY" in out


def test_a_lone_surrogate_in_a_yaml_value_is_printed_escaped(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text('compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n'
                    'mixed_precision: "\\ud83d"\n')
    code, out, err = run(["check", "--config-file", str(path)], capsys)
    assert code == 1, err
    assert "\\ud83d" in out


def test_the_json_report_of_a_surrogate_key_is_valid_json(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(SURROGATE_DS)
    code, out, _ = run(["check", "--ds-config", str(path), "--json"], capsys)
    assert code in (0, 1)
    keys = [f["key"] for f in json.loads(out)]
    assert "x\ud800" in keys            # the backslash escape is JSON's own: it reads back as the same string


def test_a_surrogate_currency_in_a_prices_file_prints(tmp_path, capsys):
    prices = tmp_path / "p.json"
    prices.write_text('{"date": "2026-12-01", "currency": "\\ud83d", "prices": {"H100-80GB": 2.5}}')
    code, out, _ = run(["compare", "--params", "125M", "--machines", "1xH100-80GB", "--prices", str(prices)], capsys)
    assert code == 0
    assert "\\ud83d" in out


def test_a_real_terminal_encoding_prints_a_surrogate_too(tmp_path):
    """The C locale's stdout uses surrogateescape, which prints only the surrogates it decoded (U+DC80..DCFF)."""
    path = tmp_path / "s.json"
    path.write_text(SURROGATE_DS)
    r = subprocess.run([sys.executable, "-m", "wizard", "check", "--ds-config", str(path)], capture_output=True,
                       text=True, errors="replace", timeout=300, env={"PATH": "/usr/bin:/bin", "LC_ALL": "C",
                                                                       "PYTHONPATH": str(Path(__file__).parents[2])})
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode in (0, 1) and "x\\ud800" in r.stdout


def test_the_caller_streams_are_left_as_they_were(capsys):
    before = sys.stdout.errors
    cli.main(["plan", "--params", "125M", "--assume", "1xH100-80GB", "--json"])
    assert sys.stdout.errors == before


# ---- 2. a network speed is a network --------------------------------------------------------------

@pytest.mark.parametrize("gbps", ["1e-308", "5e-324", "0.05", "0"])
def test_a_network_too_slow_to_train_over_is_refused_with_the_range(gbps, capsys):
    code, out, err = run(["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--inter-node-gbps", gbps],
                         capsys)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "inter-node-gbps" in lines[0] and "0.1 to 100000" in lines[0]


def test_the_same_network_in_an_answers_file_is_refused(tmp_path, capsys):
    answers = tmp_path / "a.yaml"
    answers.write_text("inter_node_gbps: 1.0e-308\n")
    code, _, err = run(["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--answers", str(answers)],
                       capsys)
    assert code == 2 and "0.1 to 100000" in err


def test_the_slowest_network_allowed_still_has_a_speed(capsys):
    code, out, err = run(["plan", "--params", "7B", "--assume", "8xH100-80GB,nodes=2", "--inter-node-gbps", "0.1",
                          "--json"], capsys)
    assert code in (0, 3), err
    speeds = [r["speed"]["tokens_per_second"] for r in json.loads(out)["plan"]["rungs"] if r.get("speed")]
    assert speeds and all(s > 0 for s in speeds)


def test_relative_speed_of_a_zero_speed_says_not_comparable():
    from wizard.planning.speed import Speed, relative

    def speed(tps):
        return Speed(step_seconds=1.0, tokens_per_second=tps, tokens_per_second_per_gpu=tps, mfu=0.0,
                     bound="compute", compute_seconds=1.0, communication_seconds=0.0, offload_seconds=0.0,
                     overhead_seconds=0.0, optimizer_seconds=0.0)
    assert relative(speed(0.0), speed(100.0)) == "not comparable"
    assert relative(speed(100.0), speed(float("nan"))) == "not comparable"
    assert relative(speed(50.0), speed(100.0)) == "2.0x slower"


# ---- 3. thousands of unknown keys: a bounded report ----------------------------------------------

def test_thousands_of_unknown_top_level_keys_are_summarised(tmp_path, capsys):
    from wizard.check.rules.common import MAX_FINDINGS_PER_RULE

    doc = {"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1}
    doc.update({f"k{i}": i for i in range(5000)})
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc))
    code, out, _ = run(["check", "--ds-config", str(path), "--json"], capsys)
    unknown = [f for f in json.loads(out) if f["rule"] == "DS-UNKNOWN-TOP-KEY"]
    assert len(unknown) == MAX_FINDINGS_PER_RULE + 1
    summary = [f for f in unknown if f["key"] is None]
    assert len(summary) == 1 and f"{5000 - MAX_FINDINGS_PER_RULE:,} more" in summary[0]["message"]


def test_the_runner_caps_any_rule_that_repeats_itself():
    from wizard.check.doctor import at_most_some_per_rule
    from wizard.check.rules.common import MAX_FINDINGS_PER_RULE, finding

    many = [finding("warning", "X-RULE", "f.json", f"k{i}", "m") for i in range(100)]
    other = [finding("error", "Y-RULE", "f.json", "a", "m")]
    out = at_most_some_per_rule(many + other)
    xs = [f for f in out if f.rule == "X-RULE"]
    assert len(xs) == MAX_FINDINGS_PER_RULE + 1 and "80 more" in xs[-1].message and "'k20'" in xs[-1].message
    assert [f for f in out if f.rule == "Y-RULE"] == other
    exactly = [finding("warning", "X-RULE", "f.json", f"k{i}", "m") for i in range(MAX_FINDINGS_PER_RULE + 1)]
    assert at_most_some_per_rule(exactly) == exactly       # one more is shown, not summarised as "1 more"


# ---- 6. a label map too large to build ------------------------------------------------------------

def test_a_huge_num_labels_is_refused_before_anything_is_built(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128, "num_labels": 10 ** 45}))
    # in a process of its own under a 4 GiB address-space cap: without the limit the label map eats the machine
    r = subprocess.run([sys.executable, "-m", "wizard", "plan", "--model", str(model), "--assume", "1xH100-80GB"],
                       capture_output=True, text=True, timeout=300, preexec_fn=_cap_memory,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[2]),
                            "WIZARD_NO_CACHE": "1", "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2, r.stderr
    assert "num_labels" in r.stderr and "1,000,000" in r.stderr and "MemoryError" not in r.stderr


def _cap_memory() -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


# ---- found by the fuzz tier itself ---------------------------------------------------------------

@pytest.mark.parametrize("architectures", [10 ** 45, "LlamaForCausalLM", [1, 2], {"a": 1}])
def test_architectures_that_is_not_a_list_of_names_is_bad_input(architectures, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    base = json.loads((Path(__file__).parents[1] / "fixtures" / "models" / "llama-tiny" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**base, "architectures": architectures}))
    code, _, err = run(["plan", "--model", str(model), "--assume", "1xH100-80GB"], capsys)
    assert code == 2 and "architectures" in err and len(err.strip().splitlines()) == 1
