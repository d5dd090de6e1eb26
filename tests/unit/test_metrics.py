"""The NVML sampler, the metrics.jsonl writer and the summary, driven by the fake NVML (8 GPUs)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from launch.metrics import (
    NO_GPU_METRICS,
    MetricsWriter,
    Sampler,
    format_summary,
    read_samples,
    summarise,
)
from wizard.probe.nvml import GpuSample, open_nvml

GPU_KEYS = {"index", "name", "util", "mem_used", "mem_total", "mem_reserved", "power_w", "power_limit_w",
            "temp_c", "sm_clock_mhz", "processes"}


@pytest.fixture
def fake8(monkeypatch):
    monkeypatch.setenv("WIZARD_FAKE_NVML", "8xH100-80GB")
    api = open_nvml()
    yield api
    api.close()


def fake_from_json(monkeypatch, tmp_path, doc):
    path = tmp_path / "fake_nvml.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("WIZARD_FAKE_NVML", str(path))
    return open_nvml()


class Exploding:
    """An NVML binding that breaks the protocol by raising: the sampler must still not raise."""
    available, reason = True, None

    def devices(self):
        raise RuntimeError("GPU is lost")

    def sample(self):
        raise RuntimeError("GPU is lost")

    def close(self):
        pass


def test_eight_gpus_sampled_with_every_field(fake8):
    pid_map = {}
    sampler = Sampler(fake8, interval=1.0, pid_to_rank=pid_map.get)
    s = sampler.sample_once()
    assert s["available"] is True and s["reason"] is None
    assert isinstance(s["t"], float)
    assert [g["index"] for g in s["gpus"]] == list(range(8))
    for g in s["gpus"]:
        assert set(g) == GPU_KEYS
        assert "H100" in g["name"]
        assert g["mem_total"] > 79 * 10**9
        assert 0 <= g["util"] <= 100
        assert 0 <= g["mem_used"] <= g["mem_total"]
    json.dumps(s)      # a sample is plain JSON


WITH_PROCESSES = {"devices": [
    {"gpu": "H100-80GB", "processes": [{"pid": 4100 + i, "used_memory": "30GB"}]} for i in range(8)
] + [{"gpu": "H100-80GB", "processes": [{"pid": 9999, "used_memory": None}]}]}


def test_processes_are_mapped_to_ranks(monkeypatch, tmp_path):
    api = fake_from_json(monkeypatch, tmp_path, WITH_PROCESSES)
    mapping = {4100 + i: i for i in range(8)}            # pid 9999 is someone else's job
    s = Sampler(api, pid_to_rank=mapping.get).sample_once()
    procs = [(g["index"], p["pid"], p["rank"], p["used_memory"]) for g in s["gpus"] for p in g["processes"]]
    assert procs[:8] == [(i, 4100 + i, i, 30 * 1024**3) for i in range(8)]
    assert procs[8] == (8, 9999, None, None)


def test_failing_pid_lookup_reads_as_no_rank(monkeypatch, tmp_path):
    def broken(pid):
        raise ProcessLookupError(pid)
    api = fake_from_json(monkeypatch, tmp_path, WITH_PROCESSES)
    s = Sampler(api, pid_to_rank=broken).sample_once()
    assert [p["rank"] for g in s["gpus"] for p in g["processes"]] == [None] * 9


def test_a_failing_metric_is_none_and_the_rest_is_kept(monkeypatch, tmp_path):
    doc = {"devices": [{"gpu": "H100-80GB", **({"fail": ["power_w", "temp_c"]} if i == 3 else {})}
                       for i in range(8)]}
    s = Sampler(fake_from_json(monkeypatch, tmp_path, doc)).sample_once()
    assert s["available"] is True
    assert s["gpus"][3]["power_w"] is None and s["gpus"][3]["temp_c"] is None
    assert s["gpus"][3]["util"] is not None and s["gpus"][3]["power_limit_w"] == 700
    assert all(g["power_w"] is not None for g in s["gpus"] if g["index"] != 3)


@pytest.mark.parametrize("spec", ["none", None])
def test_unavailable_nvml_gives_the_message(monkeypatch, spec):
    if spec is None:
        monkeypatch.delenv("WIZARD_FAKE_NVML", raising=False)   # this machine: no NVIDIA driver
    else:
        monkeypatch.setenv("WIZARD_FAKE_NVML", spec)
    api = open_nvml()
    if api.available:
        pytest.skip("a real GPU is present")
    s = Sampler(api).sample_once()
    assert s["available"] is False
    assert s["reason"].startswith(NO_GPU_METRICS)
    assert s["gpus"] == []


def test_sample_never_raises():
    s = Sampler(Exploding()).sample_once()
    assert s["available"] is False
    assert "GPU is lost" in s["reason"] and s["reason"].startswith(NO_GPU_METRICS)


def test_thread_respects_interval_and_stop_joins(fake8):
    got: list[float] = []
    sampler = Sampler(fake8, interval=0.25, on_sample=lambda s: got.append(time.monotonic()))
    sampler.start()
    time.sleep(1.2)
    sampler.stop()
    assert not sampler.running
    assert not any(t.name == "wizard-gpu-sampler" for t in threading.enumerate())
    n = len(got)
    assert 4 <= n <= 7, got                  # 0, .25, .5, .75, 1.0 (+ scheduling slack)
    gaps = [b - a for a, b in zip(got, got[1:])]
    assert all(0.15 < g < 0.5 for g in gaps), gaps
    time.sleep(0.4)
    assert len(got) == n                     # nothing after stop()


def test_callback_errors_do_not_kill_the_thread_and_the_first_is_logged(fake8, capsys):
    calls = []

    def bad(sample):
        calls.append(sample)
        raise ValueError("disk full")
    with Sampler(fake8, interval=0.25, on_sample=bad) as sampler:
        time.sleep(0.6)
    assert len(calls) >= 2 and sampler.callback_errors == len(calls)
    assert capsys.readouterr().err.splitlines() == [
        "wizard launch: a GPU metrics sample was not recorded: ValueError: disk full"]


def test_interval_has_a_floor(fake8):
    assert Sampler(fake8, interval=0.001).interval == 0.25


def test_summary_peak_memory_and_mean_util():
    def sample(t, utils, mems, available=True):
        return {"t": t, "available": available, "reason": None, "gpus": [
            {"index": i, "name": "H100", "util": u, "mem_used": m, "mem_total": 100,
             "power_w": None, "power_limit_w": None, "temp_c": None, "sm_clock_mhz": None,
             "processes": []} for i, (u, m) in enumerate(zip(utils, mems))]}
    samples = [sample(0, [10, 50], [20, 70]), sample(1, [30, None], [60, 40]),
               {"t": 2, "available": False, "reason": "x", "gpus": []}]
    s = summarise(samples)
    assert s["available"] and s["samples"] == 3
    assert [g["peak_mem_used"] for g in s["gpus"]] == [60, 70]
    assert [g["mean_util"] for g in s["gpus"]] == [20, 50]
    assert s["peak_mem_used"] == 70 and s["peak_gpu"] == 1
    assert s["mean_util"] == 35
    assert format_summary(s) == "peak GPU mem 70 B/100 B (GPU 1), util 35%"


def test_summary_without_gpus():
    s = summarise([{"t": 0, "available": False, "reason": NO_GPU_METRICS, "gpus": []}])
    assert not s["available"] and s["peak_mem_used"] is None
    assert format_summary(s) == NO_GPU_METRICS
    assert summarise([])["available"] is False


def test_writer_appends_and_stays_bounded(tmp_path, fake8):
    path = tmp_path / "metrics.jsonl"
    cap = 20_000
    writer = MetricsWriter(path, max_bytes=cap)
    sampler = Sampler(fake8)
    written = []
    for i in range(200):
        s = sampler.sample_once()
        s["t"] = float(i)
        writer(s)
        written.append(s)
        assert os.path.getsize(path) <= cap
    assert writer.rotations >= 1
    kept = read_samples(path)
    assert kept, "newest samples must survive a rotation"
    assert [s["t"] for s in kept] == [float(i) for i in range(200 - len(kept), 200)]
    assert kept[-1] == written[-1]
    # every line is whole JSON: a rotation never leaves half a sample at the start
    for line in path.read_text().splitlines():
        json.loads(line)


def test_writer_resumes_an_existing_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    MetricsWriter(path).write({"t": 1.0, "available": False, "reason": NO_GPU_METRICS, "gpus": []})
    MetricsWriter(path).write({"t": 2.0, "available": False, "reason": NO_GPU_METRICS, "gpus": []})
    assert [s["t"] for s in read_samples(path)] == [1.0, 2.0]
    assert read_samples(path, last=1)[0]["t"] == 2.0


def test_read_samples_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"t": 1, "available": false, "reason": null, "gpus": []}\n{"t": 2, "avail')
    assert [s["t"] for s in read_samples(path)] == [1]
    assert read_samples(tmp_path / "missing.jsonl") == []


def test_gpu_sample_none_fields_stay_none():
    from launch.metrics import gpu_sample_to_dict
    d = gpu_sample_to_dict(GpuSample(index=0), None)
    assert d["util"] is None and d["name"] is None and d["processes"] == []
