"""wizard.probe.hardware and wizard.probe.catalogue: catalogue lookups, --assume specs, saved-probe JSON,
the probe (this machine, and the fake NVML), describe/warnings, and the snapshot files.

snapshots/hardware/ holds saved probes of typical machines (GPU part from the fake NVML, host
part fixed) and their `wizard probe` text. Regenerate after an intended change with:
    python tests/unit/test_hardware.py --regen
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.markers import needs_no_driver
from wizard.errors import InputError
from wizard.probe import catalogue, hardware
from wizard.probe.hardware import GPU, Hardware, assume, describe, from_json, load_file, probe, warnings
from wizard.probe.nvml import FAKE_ENV

GiB = 1024**3
MiB = 1024**2
SNAPSHOTS = Path(__file__).resolve().parents[2] / "snapshots" / "hardware"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Each test starts without the variables the probe reads."""
    for key in list(os.environ):
        if key.startswith("SLURM_") or key in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", FAKE_ENV):
            monkeypatch.delenv(key, raising=False)


# ============================================================================================
# catalogue

REQUIRED_PARTS = ["H200-141GB", "H100-80GB", "H100-PCIe-80GB", "H100-NVL-94GB", "H800-80GB", "A100-80GB",
                  "A100-40GB", "A800-80GB", "A10-24GB", "A10G-24GB", "A30-24GB", "A40-48GB", "L4-24GB",
                  "L40-48GB", "L40S-48GB", "V100-16GB", "V100-32GB", "T4-16GB", "RTXA6000-48GB",
                  "RTX6000Ada-48GB", "RTXA5000-24GB", "RTXA4000-16GB", "RTX3090-24GB", "RTX3090Ti-24GB",
                  "RTX4090-24GB", "RTX4080-16GB", "RTX5090-32GB", "B200-180GB", "GH200-96GB"]


def test_catalogue_has_the_common_parts():
    assert set(REQUIRED_PARTS) <= set(catalogue.names())
    assert len(catalogue.names()) == len(set(catalogue.names()))


@pytest.mark.parametrize("spec", catalogue.CATALOGUE, ids=lambda s: s.name)
def test_catalogue_entries_are_consistent(spec):
    # NVML's total is within a few percent of the marketing figure, never far off.
    assert abs(spec.memory / GiB - spec.mem_tags[0]) / spec.mem_tags[0] < 0.08
    assert spec.memory % MiB == 0
    assert spec.bf16 == (spec.compute_capability >= (8, 0))
    assert catalogue.lookup(spec.name) is spec
    assert catalogue.match_device(spec.nvml_name, spec.memory) is spec
    assert spec.kind in ("datacenter", "workstation", "consumer")
    assert 50 <= spec.power_limit_w <= 1200


@pytest.mark.parametrize("text, name", [
    ("H100-80GB", "H100-80GB"), ("h100-80gb", "H100-80GB"), ("H100 80GB", "H100-80GB"),
    ("A100-40GB", "A100-40GB"), ("a100_40g", "A100-40GB"), ("A100-SXM4-80GB", "A100-80GB"),
    ("A100-PCIe-40GB", "A100-PCIe-40GB"), ("RTX4090", "RTX4090-24GB"), ("4090", "RTX4090-24GB"),
    ("rtx 4090", "RTX4090-24GB"), ("NVIDIA GeForce RTX 4090", "RTX4090-24GB"), ("RTX3090Ti", "RTX3090Ti-24GB"),
    ("H100-94GB", "H100-NVL-94GB"), ("H100-NVL", "H100-NVL-94GB"), ("H100 PCIe", "H100-PCIe-80GB"),
    ("a10g", "A10G-24GB"), ("A10", "A10-24GB"), ("L40S", "L40S-48GB"), ("L4", "L4-24GB"),
    ("RTX 6000 Ada", "RTX6000Ada-48GB"), ("A6000", "RTXA6000-48GB"), ("B200-192GB", "B200-180GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"), ("Tesla V100-SXM2-16GB", "V100-16GB"), ("t4", "T4-16GB"),
    ("GH200", "GH200-96GB"), ("H200", "H200-141GB"),
])
def test_lookup_accepts_usual_spellings(text, name):
    assert catalogue.lookup(text).name == name


@pytest.mark.parametrize("text, chosen, other", [
    ("h100", "H100-80GB", "H100-NVL-94GB"), ("A100", "A100-80GB", "A100-40GB"), ("V100", "V100-32GB", "V100-16GB"),
])
def test_model_without_size_takes_the_common_one_and_says_so(text, chosen, other):
    spec, note = catalogue.resolve(text)
    assert spec.name == chosen
    assert note and chosen in note and other in note


def test_single_size_models_need_no_note():
    assert catalogue.resolve("RTX4090")[1] is None
    assert catalogue.resolve("H100-80GB")[1] is None


def test_unknown_gpu_is_an_input_error_listing_the_catalogue():
    with pytest.raises(InputError) as err:
        catalogue.lookup("Z9000")
    assert err.value.field == "assume"
    assert "Z9000" in str(err.value) and "H100-80GB" in err.value.allowed and "RTX4090-24GB" in err.value.allowed
    assert "\n" not in str(err.value)


def test_known_model_with_wrong_memory_lists_its_sizes():
    with pytest.raises(InputError) as err:
        catalogue.lookup("A100-24GB")
    assert err.value.allowed == "A100-80GB, A100-40GB"


def test_match_device_by_memory_when_the_name_has_none():
    spec = catalogue.match_device("NVIDIA A100-SXM4-40GB")
    assert spec.name == "A100-40GB"
    assert catalogue.match_device("NVIDIA Quadro FX 5800") is None


# ============================================================================================
# assume

def test_assume_8xh100():
    hw = assume("8xH100-80GB")
    assert hw.num_gpus == 8 and hw.all_bf16 and hw.nvlink is True
    assert [g.index for g in hw.gpus] == list(range(8))
    assert hw.min_gpu_memory == 81559 * MiB
    assert all(g.compute_capability == (9, 0) and g.memory_free is None for g in hw.gpus)
    assert hw.source == "assume:8xH100-80GB"
    assert hw.ram_total == hardware.assumed_ram(8 * 81559 * MiB) >= 2 * 8 * 81559 * MiB
    assert hw.ram_total % (16 * GiB) == 0 and hw.ram_available == int(hw.ram_total * 0.9)
    assert hw.cpu_cores == 128
    assert hw.libraries == {} and hw.driver_version is None and hw.p2p is None
    assert any("RAM" in n for n in hw.notes) and any("CPU" in n for n in hw.notes)


def test_assume_with_ram():
    hw = assume("4xA100-40GB,ram=512G")
    assert hw.num_gpus == 4 and hw.gpus[0].memory_total == 40960 * MiB
    assert hw.ram_total == 512 * GiB and hw.ram_available == int(512 * GiB * 0.9)
    assert not any("RAM" in n for n in hw.notes)


def test_assume_consumer_pair():
    hw = assume("2xRTX4090")
    assert hw.num_gpus == 2 and hw.nvlink is False and hw.all_bf16
    assert hw.ram_total == 64 * GiB * 1.5 and hw.cpu_cores == 16


def test_assume_small_box_gets_the_floor():
    hw = assume("1xT4")
    assert hw.ram_total == 64 * GiB and hw.cpu_cores == 16 and hw.nvlink is None and not hw.all_bf16


def test_assume_every_option():
    hw = assume(" 2x h100-80gb , cpus=96, disk=2T, nodes=4, nvlink=no ")
    assert hw.cpu_cores == 96 and hw.disk_free_output == hw.disk_free_nvme == 2 * 1024**4
    assert hw.num_machines_hint == 4 and hw.nvlink is False
    assert hw.source == "assume:2x h100-80gb , cpus=96, disk=2T, nodes=4, nvlink=no"


def test_assume_mixed_models():
    hw = assume("2xA100-80GB+2xA100-40GB")
    assert hw.num_gpus == 4 and hw.min_gpu_memory == 40960 * MiB and hw.nvlink is False
    assert "mixed GPU models" in warnings(hw)[0]


def test_assume_model_without_size_notes_the_choice():
    hw = assume("8xA100")
    assert hw.gpus[0].memory_total == 81920 * MiB
    assert any("A100-40GB" in n for n in hw.notes)


@pytest.mark.parametrize("spec", [
    "", "   ", "H100", "x8H100", "8x", "0xH100-80GB", "65xH100-80GB", "40xH100-80GB+40xA100-80GB",
    "8xH100-13GB", "8xFOO", "8xH100,ram=abc", "8xH100,ram=0G", "8xH100,ram=-5G", "8xH100,cpus=0",
    "8xH100,cpus=two", "8xH100,nodes=0", "8xH100,foo=1", "8xH100,nvlink=maybe", "8xH100,ram=1G,ram=2G",
    "8xH100,ram", "8xH100,=5",
])
def test_bad_assume_specs(spec):
    with pytest.raises(InputError) as err:
        assume(spec)
    assert err.value.field == "assume"
    assert err.value.allowed
    assert "\n" not in str(err.value)


def test_bad_assume_says_the_format():
    with pytest.raises(InputError) as err:
        assume("H100")
    assert "COUNTxGPU" in err.value.allowed


# ============================================================================================
# JSON

HW_KEYS = [f.name for f in dataclasses.fields(Hardware)]
GPU_KEYS = [f.name for f in dataclasses.fields(GPU)]


def test_from_json_checks_every_field():
    # A field added to the dataclasses must get a type in the validator too, or it would be dropped.
    assert set(hardware._HW_FIELDS) | {"gpus"} == set(HW_KEYS)
    assert set(hardware._GPU_FIELDS) == set(GPU_KEYS)


def _roundtrip(hw: Hardware) -> Hardware:
    return from_json(json.loads(json.dumps(hw.to_json())))


def test_to_json_shape_is_stable():
    doc = assume("2xH100-80GB").to_json()
    assert list(doc) == HW_KEYS
    assert list(doc["gpus"][0]) == GPU_KEYS
    assert doc["gpus"][0]["compute_capability"] == [9, 0]
    assert HW_KEYS[:18] == ["gpus", "gpu_reason", "driver_version", "cuda_version", "nvlink", "p2p", "cpu_cores",
                            "ram_total", "ram_available", "output_dir", "disk_free_output", "nvme_path",
                            "disk_free_nvme", "libraries", "env", "source", "num_machines_hint",
                            "cpu_physical_cores"]


@pytest.mark.parametrize("spec", ["8xH100-80GB", "4xA100-40GB,ram=512G,disk=1T,nodes=2", "2xRTX4090,nvlink=yes"])
def test_assumed_hardware_round_trips(spec):
    hw = assume(spec)
    assert _roundtrip(hw) == hw


def test_probed_hardware_round_trips(monkeypatch):
    assert _roundtrip(probe()) is not None
    monkeypatch.setenv(FAKE_ENV, "4xL40S")
    monkeypatch.setenv("SLURM_NNODES", "2")
    hw = probe()
    back = _roundtrip(hw)
    assert back == hw and back.gpus[0].compute_capability == (8, 9)


def test_minimal_saved_probe_gets_defaults():
    hw = from_json({"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_total": 81920 * MiB,
                              "compute_capability": [8, 0]},
                             {"name": "Tesla V100-SXM2-16GB", "memory_total": 16 * GiB}]})
    assert [g.index for g in hw.gpus] == [0, 1]
    assert hw.gpus[0].bf16 is True and hw.gpus[1].bf16 is False
    assert hw.cpu_cores == 1 and hw.libraries == {} and hw.source == "probe" and hw.notes == []


def test_unknown_fields_are_ignored_and_plan_documents_accepted():
    doc = assume("2xA10G").to_json()
    doc["from_the_future"] = {"x": 1}
    doc["gpus"][0]["fan_speed"] = 30
    assert from_json(doc).num_gpus == 2
    assert from_json({"hardware": doc, "model": {}, "plan": {}}).num_gpus == 2


def test_source_override():
    assert from_json(assume("1xL4").to_json(), source="file:/x.json").source == "file:/x.json"


def _with(path: str, value):
    doc = assume("2xH100-80GB").to_json()
    target = doc
    *parents, last = path.split(".")
    for p in parents:
        target = target[int(p)] if p.isdigit() else target[p]
    target[last] = value
    return doc


@pytest.mark.parametrize("doc, words", [
    ([], "JSON object"),
    ("text", "JSON object"),
    ({"driver_version": "550"}, "gpus"),
    ({"gpus": {}}, "gpus must be a list"),
    ({"gpus": ["H100"]}, "gpus[0] must be an object"),
    ({"gpus": [{"name": "x"}]}, "gpus[0].memory_total is missing"),
    (_with("gpus.0.memory_total", "80GB"), "gpus[0].memory_total"),
    (_with("gpus.0.memory_total", 0), "positive"),
    (_with("gpus.1.memory_total", True), "gpus[1].memory_total"),
    (_with("gpus.0.compute_capability", [9]), "compute_capability"),
    (_with("gpus.0.bf16", "yes"), "bf16"),
    (_with("gpus.0.name", None), "must not be null"),
    (_with("nvlink", "yes"), "nvlink"),
    (_with("cpu_cores", 0), "cpu_cores"),
    (_with("ram_total", -1), "ram_total"),
    (_with("ram_total", 1.5), "ram_total"),
    (_with("libraries", {"torch": 2}), "libraries"),
    (_with("env", {"SLURM_NNODES": 2}), "env"),
    (_with("p2p", [["X", 1]]), "p2p"),
    (_with("notes", "hello"), "notes"),
    (_with("source", None), "source"),
])
def test_bad_saved_probes(doc, words):
    with pytest.raises(InputError) as err:
        from_json(doc)
    assert err.value.field == "hardware"
    assert words in str(err.value) and "\n" not in str(err.value)


def test_load_file(tmp_path):
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(assume("2xRTX4090").to_json()))
    hw = load_file(str(path))
    assert hw.num_gpus == 2 and hw.source == f"file:{path}"


@pytest.mark.parametrize("content, words", [
    (None, "cannot read"), ("{not json", "is not valid JSON"), ("", "is not valid JSON"), (b"\xff\xfe\x00", "not UTF-8 text"),
    ("[1, 2]", "JSON object"),
])
def test_load_file_errors(tmp_path, content, words):
    path = tmp_path / "probe.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(InputError) as err:
        load_file(str(path))
    assert err.value.field == "hardware" and words in str(err.value)


def test_load_file_on_a_directory(tmp_path):
    with pytest.raises(InputError) as err:
        load_file(str(tmp_path))
    assert err.value.field == "hardware"


# ============================================================================================
# probe

def test_libaio_lookup_without_a_usable_temp_dir_is_not_found(monkeypatch):
    def no_temp_dir(name):      # what find_library's gcc fallback raises when tempfile finds no directory
        raise FileNotFoundError("No usable temporary directory found in ['/tmp', '/var/tmp', '/usr/tmp']")
    monkeypatch.setattr(ctypes.util, "find_library", no_temp_dir)
    assert hardware.aio_available() is False


@needs_no_driver
def test_probe_this_machine_without_a_driver():
    hw = probe()
    assert hw.gpus == [] and hw.source == "probe"
    assert hw.gpu_reason == "NVML Shared Library Not Found: no NVIDIA driver on this machine"
    assert hw.ram_total > 0 and 0 < hw.ram_available <= hw.ram_total
    assert hw.cpu_cores >= 1
    for lib in ("torch", "accelerate", "deepspeed", "transformers", "textual"):
        assert hw.libraries[lib] == metadata.version(lib)
    assert hw.disk_free_output and hw.disk_free_output > 0
    assert hw.aio_available == (ctypes.util.find_library("aio") is not None)
    assert hw.nvlink is None and hw.p2p is None and hw.driver_version is None
    assert warnings(hw)[0].startswith("no NVIDIA GPU (NVML Shared Library Not Found")
    assert describe(hw)[1] == "GPUs: none (NVML Shared Library Not Found: no NVIDIA driver on this machine)"


def test_probe_output_dir_follows_accelerate(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    hw = probe()
    assert hw.output_dir == str(tmp_path / "hf" / "accelerate")      # not created, but measured
    assert hw.disk_free_output > 0
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert probe().output_dir == str(tmp_path / "cache" / "huggingface" / "accelerate")
    assert probe(output_dir=str(tmp_path / "out")).output_dir == str(tmp_path / "out")


def test_accelerate_config_dir_matches_accelerate(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    code = "from accelerate.commands.config.config_args import cache_dir; print(cache_dir)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert hardware.accelerate_config_dir() == out.stdout.strip()


def test_probe_nvme_path(monkeypatch, tmp_path):
    assert probe(nvme_path=str(tmp_path)).nvme_path == str(tmp_path)
    first, second = tmp_path / "a", tmp_path / "b"
    second.mkdir()
    monkeypatch.setattr(hardware, "NVME_CANDIDATES", (str(first), str(second)))
    hw = probe()
    assert hw.nvme_path == str(second) and hw.disk_free_nvme > 0
    monkeypatch.setattr(hardware, "NVME_CANDIDATES", (str(first),))
    hw = probe()
    assert hw.nvme_path is None and hw.disk_free_nvme is None
    assert any("no candidate path" in line for line in describe(hw))


def test_probe_with_the_fake_8xh100(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "8xH100-80GB,idle")
    hw = probe()
    assert hw.num_gpus == 8 and hw.all_bf16 and hw.nvlink is True
    assert hw.gpu_reason is None and hw.driver_version == "550.54.15" and hw.cuda_version == "12.4"
    assert len(hw.p2p) == 8 and all(len(r) == 8 for r in hw.p2p)
    assert [g.index for g in hw.gpus] == [g.nvml_index for g in hw.gpus] == list(range(8))
    assert all(0 < g.memory_free <= g.memory_total == 81559 * MiB for g in hw.gpus)
    assert warnings(hw) == [w for w in warnings(hw) if "not installed" in w]   # nothing about the GPUs


def test_probe_busy_gpus_are_warned_about(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "2xA100-80GB")
    hw = probe()
    assert all(g.memory_free < g.memory_total * 0.5 for g in hw.gpus)
    assert sum("already has" in w for w in warnings(hw)) == 2


def test_probe_respects_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "8xH100-80GB,idle")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,2")
    hw = probe()
    assert [g.index for g in hw.gpus] == [0, 1]
    assert [g.nvml_index for g in hw.gpus] == [6, 2]
    assert hw.env["CUDA_VISIBLE_DEVICES"] == "6,2"
    assert hw.nvlink is True and len(hw.p2p) == 2
    uuid = hw.gpus[1].uuid
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", uuid[:13])
    assert [g.nvml_index for g in probe().gpus] == [2]


def test_probe_with_all_gpus_hidden(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "4xA100-80GB")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hw = probe()
    assert hw.gpus == [] and "hides all 4 GPUs" in hw.gpu_reason
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,9")
    hw = probe()
    assert [g.nvml_index for g in hw.gpus] == [1] and any("out of range" in n for n in hw.notes)
    assert any(line.startswith("Note: CUDA_VISIBLE_DEVICES") for line in describe(hw))


def test_probe_metric_failure_is_none(monkeypatch, tmp_path):
    doc = {"devices": [{"gpu": "L4", "fail": ["mem_used", "uuid", "compute_capability"]}, {"gpu": "L4"}]}
    path = tmp_path / "fake.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(FAKE_ENV, str(path))
    hw = probe()
    assert hw.gpus[0].memory_free is None and hw.gpus[0].uuid is None
    assert hw.gpus[0].compute_capability is None and hw.gpus[0].bf16 is False
    assert hw.gpus[1].memory_free is not None and hw.gpus[1].bf16 is True
    assert "cc ?" in describe(hw)[2]


def test_probe_with_no_nvml_from_the_fake(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "none")
    hw = probe()
    assert hw.gpus == [] and "no NVIDIA driver" in hw.gpu_reason


def test_probe_survives_an_nvml_surprise(monkeypatch):
    class Broken:
        available, reason = True, None

        def driver_version(self):
            return "550"

        def cuda_version(self):
            return None

        def devices(self):
            raise RuntimeError("GPU fell off the bus")

        def close(self):
            pass

    monkeypatch.setattr("wizard.probe.nvml.open_nvml", lambda: Broken())
    hw = probe()
    assert hw.gpus == [] and "GPU fell off the bus" in hw.gpu_reason and hw.ram_total > 0


def test_probe_bad_fake_spec_is_an_input_error(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "8xWHAT")
    with pytest.raises(InputError) as err:
        probe()
    assert err.value.field == FAKE_ENV


def test_probe_reads_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_NNODES", "4")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[01-04]")
    monkeypatch.setenv("UNRELATED_SECRET", "x")
    hw = probe()
    assert hw.num_machines_hint == 4
    assert hw.env["SLURM_JOB_NODELIST"] == "node[01-04]" and "UNRELATED_SECRET" not in hw.env
    assert list(hw.env) == sorted(hw.env)
    monkeypatch.setenv("SLURM_NNODES", "x")
    assert probe().num_machines_hint is None


def test_cgroup_v2_limit(tmp_path):
    (tmp_path / "job").mkdir()
    (tmp_path / "memory.max").write_text("max\n")
    (tmp_path / "job" / "memory.max").write_text(str(8 * GiB))
    (tmp_path / "job" / "memory.current").write_text(str(GiB))
    cg = tmp_path / "cgroup"
    cg.write_text("0::/job\n")
    assert hardware.cgroup_memory(str(tmp_path), str(cg)) == (8 * GiB, GiB)


def test_cgroup_v1_limit_and_unlimited(tmp_path):
    mem = tmp_path / "memory"
    mem.mkdir()
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712")
    cg = tmp_path / "cgroup"
    cg.write_text("4:memory:/\n0::/\n")
    assert hardware.cgroup_memory(str(tmp_path), str(cg)) is None
    (mem / "memory.limit_in_bytes").write_text(str(16 * GiB))
    (mem / "memory.usage_in_bytes").write_text(str(2 * GiB))
    assert hardware.cgroup_memory(str(tmp_path), str(cg)) == (16 * GiB, 2 * GiB)
    assert hardware.cgroup_memory(str(tmp_path / "none"), str(tmp_path / "none")) is None


def test_probe_applies_a_cgroup_cap(monkeypatch):
    monkeypatch.setattr(hardware, "cgroup_memory", lambda: (4 * GiB, 3 * GiB))
    hw = probe()
    assert hw.ram_total == 4 * GiB and hw.ram_available <= GiB
    assert any("cgroup" in n for n in hw.notes)


def test_probe_does_not_import_heavy_libraries():
    code = ("import json, sys\nimport wizard.probe.hardware as h\nh.probe()\n"
            "print(json.dumps([m for m in ('torch', 'transformers', 'deepspeed', 'accelerate', 'textual') "
            "if m in sys.modules]))")
    for fake in ("", "8xH100-80GB"):
        env = {**os.environ, FAKE_ENV: fake}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == [], f"WIZARD_FAKE_NVML={fake!r}"


# ============================================================================================
# describe / warnings

def _hw(**kw) -> Hardware:
    base = assume("2xH100-80GB")
    return dataclasses.replace(base, notes=[], **kw)


def test_warning_old_driver():
    ws = warnings(_hw(driver_version="525.147.05"))
    assert any("older than 535" in w for w in ws)
    assert not any("older than 535" in w for w in warnings(_hw(driver_version="535.104.05")))


def test_warning_rtx40_driver():
    rtx = assume("2xRTX4090")
    assert any("NCCL_P2P_DISABLE" in w for w in warnings(dataclasses.replace(rtx, driver_version="545.29.06")))
    assert not any("NCCL_P2P_DISABLE" in w for w in warnings(dataclasses.replace(rtx, driver_version="550.40.07")))
    one = assume("1xRTX4090")
    assert not any("NCCL_P2P_DISABLE" in w for w in warnings(dataclasses.replace(one, driver_version="535.1")))


def test_warning_no_nvlink_only_with_several_gpus():
    assert any("no NVLink between the 2 GPUs" in w for w in warnings(_hw(nvlink=False)))
    assert not any("NVLink" in w for w in warnings(_hw(nvlink=True)))
    assert not any("NVLink" in w for w in warnings(assume("1xL4")))


def test_warning_missing_libraries():
    ws = warnings(_hw(libraries={"torch": "2.13.0", "accelerate": None, "deepspeed": None, "flash-attn": None}))
    assert any(w.startswith("DeepSpeed is not installed") for w in ws)
    assert any(w.startswith("accelerate is not installed") for w in ws)
    assert not any("flash" in w for w in ws)


def test_warning_mixed_models_and_device_order():
    hw = dataclasses.replace(assume("1xA100-80GB+1xA100-40GB"), source="probe")
    ws = warnings(hw)
    assert any("mixed GPU models" in w and "40.0 GiB" in w for w in ws)
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in w for w in ws)
    hw.env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert not any("CUDA_DEVICE_ORDER" in w for w in warnings(hw))


def test_no_warnings_for_a_plain_assumed_server():
    assert warnings(assume("8xH100-80GB")) == []


def test_describe_assumed_machine():
    lines = describe(assume("2xRTX4090,ram=128G,cpus=32"))
    assert lines[0] == "Source: assumed machine (2xRTX4090,ram=128G,cpus=32)"
    assert lines[1] == "GPUs: 2 x NVIDIA GeForce RTX 4090"
    assert lines[2] == "  GPU 0: NVIDIA GeForce RTX 4090, 24.0 GiB total, cc 8.9, bf16"
    assert "RAM: 128.0 GiB total, 115.2 GiB available" in lines
    assert "CPU: 32 logical cores" in lines


# ============================================================================================
# snapshots: saved probes of typical machines (usable with --hardware) and their text

LIBS = {"torch": "2.13.0", "accelerate": "1.15.0", "deepspeed": "0.19.8", "transformers": "5.24.0",
        "textual": "8.2.8", "flash-attn": "2.8.3", "bitsandbytes": None, "nvidia-ml-py": "13.615.71"}
TiB = 1024 * GiB
SNAPSHOT_CASES = {
    "8xH100-80GB": dict(
        fake="8xH100-80GB,idle", visible=None,
        host=dict(cpu_cores=224, cpu_physical_cores=112, ram_total=2015 * GiB, ram_available=1960 * GiB,
                  output_dir="/home/user/.cache/huggingface/accelerate", disk_free_output=1200 * GiB,
                  nvme_path="/local_nvme", disk_free_nvme=int(3.5 * TiB), aio_available=True, libraries=LIBS,
                  env={}, num_machines_hint=None)),
    "2xRTX4090-driver535": dict(
        fake="2xRTX4090,idle,driver=535.104.05,cuda=12.2", visible=None,
        host=dict(cpu_cores=32, cpu_physical_cores=16, ram_total=125 * GiB, ram_available=118 * GiB,
                  output_dir="/home/user/.cache/huggingface/accelerate", disk_free_output=800 * GiB,
                  nvme_path=None, disk_free_nvme=None, aio_available=False,
                  libraries={**LIBS, "flash-attn": None}, env={}, num_machines_hint=None)),
    "4xA100-40GB-slurm-2nodes": dict(
        fake="8xA100-40GB,idle,driver=550.90.07", visible="0,1,2,3",
        host=dict(cpu_cores=64, cpu_physical_cores=32, ram_total=503 * GiB, ram_available=480 * GiB,
                  output_dir="/home/user/.cache/huggingface/accelerate", disk_free_output=300 * GiB,
                  nvme_path="/scratch", disk_free_nvme=6 * TiB, aio_available=True, libraries=LIBS,
                  env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "SLURM_JOB_ID": "123456",
                       "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_NNODES": "2", "SLURM_NTASKS_PER_NODE": "1"},
                  num_machines_hint=2)),
    "1xL4": dict(
        fake="1xL4,idle,driver=550.54.15", visible=None,
        host=dict(cpu_cores=8, cpu_physical_cores=4, ram_total=31 * GiB, ram_available=29 * GiB,
                  output_dir="/home/user/.cache/huggingface/accelerate", disk_free_output=90 * GiB,
                  nvme_path=None, disk_free_nvme=None, aio_available=False, libraries=LIBS, env={},
                  num_machines_hint=None)),
    "no-gpu": dict(
        fake="none", visible=None,
        host=dict(gpu_reason="NVML Shared Library Not Found: no NVIDIA driver on this machine",
                  cpu_cores=2, cpu_physical_cores=2, ram_total=24 * GiB, ram_available=23 * GiB,
                  output_dir="/home/user/.cache/huggingface/accelerate", disk_free_output=78 * GiB,
                  nvme_path=None, disk_free_nvme=None, aio_available=False, libraries=LIBS, env={},
                  num_machines_hint=None)),
}


def make_snapshot(name: str) -> Hardware:
    """The GPU part from the fake NVML through the real probe; the host part fixed."""
    case = SNAPSHOT_CASES[name]
    saved = {k: os.environ.get(k) for k in (FAKE_ENV, "CUDA_VISIBLE_DEVICES")}
    try:
        os.environ[FAKE_ENV] = case["fake"]
        if case["visible"] is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = case["visible"]
        hw = probe()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return dataclasses.replace(hw, notes=[], **case["host"])


def snapshot_texts(name: str) -> tuple[str, str]:
    hw = make_snapshot(name)
    doc = json.dumps(hw.to_json(), indent=2, sort_keys=True) + "\n"
    text = "\n".join(describe(hw) + [f"warning: {w}" for w in warnings(hw)]) + "\n"
    return doc, text


@pytest.mark.parametrize("name", sorted(SNAPSHOT_CASES))
def test_snapshot(name):
    doc, text = snapshot_texts(name)
    hint = "if intended, run: python tests/unit/test_hardware.py --regen"
    assert (SNAPSHOTS / f"{name}.json").read_text() == doc, hint
    assert (SNAPSHOTS / f"{name}.txt").read_text() == text, hint
    loaded = load_file(str(SNAPSHOTS / f"{name}.json"))
    assert loaded == dataclasses.replace(make_snapshot(name), source=f"file:{SNAPSHOTS / name}.json")


def test_snapshot_warnings_say_what_matters():
    text = {name: (SNAPSHOTS / f"{name}.txt").read_text() for name in SNAPSHOT_CASES}
    assert "NCCL_P2P_DISABLE" in text["2xRTX4090-driver535"]
    assert "warning: no NVIDIA GPU" in text["no-gpu"]
    assert "warning" not in text["8xH100-80GB"] and "warning" not in text["1xL4"]
    assert "Machines: 2 (from SLURM)" in text["4xA100-40GB-slurm-2nodes"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--regen"]:
        sys.exit("usage: python tests/unit/test_hardware.py --regen")
    SNAPSHOTS.mkdir(parents=True, exist_ok=True)
    for case in sorted(SNAPSHOT_CASES):
        doc, text = snapshot_texts(case)
        (SNAPSHOTS / f"{case}.json").write_text(doc)
        (SNAPSHOTS / f"{case}.txt").write_text(text)
        print(f"wrote {SNAPSHOTS / case}.json and .txt")


def test_every_consumer_gpus_bf16_peak_is_the_fp32_accumulate_figure():
    """One convention for `tensor16` (the one the speed model's efficiencies were fitted with): dense bf16/fp16 with
    FP32 accumulate. On GeForce cards that rate is half the FP16-accumulate one and, in NVIDIA's whitepapers (GA102,
    AD102, GB202), twice the non-tensor FP32 peak. The RTX 3090 and 3090 Ti read their FP32 figure (35.6, 40): a
    3090 planned at half its tensor rate beside a 4090 at its full one (issue 29)."""
    from wizard.probe.catalogue import CATALOGUE, performance
    consumer = [spec for spec in CATALOGUE if spec.consumer]
    assert {s.name for s in consumer} >= {"RTX5090-32GB", "RTX4090-24GB", "RTX4080-16GB", "RTX3090Ti-24GB",
                                          "RTX3090-24GB"}
    for spec in consumer:
        perf = performance(spec)
        assert perf.tensor16 == pytest.approx(2 * perf.fp32, rel=0.01), (spec.name, perf)
