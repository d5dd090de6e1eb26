"""The NVML sampler, the metrics.jsonl writer and the summary, driven by the fake NVML (8 GPUs)."""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace

import pytest

from launch.metrics import (
    NO_GPU_METRICS, MetricsWriter, Sampler, format_summary, read_samples, summarise,
)
from wizard.nvml import GpuProcess, GpuSample, GpuStatic, open_nvml

GPU_KEYS = {"index", "name", "util", "mem_used", "mem_total", "power_w", "power_limit_w",
            "temp_c", "sm_clock_mhz", "processes"}


class _InterimFake:
    """Stand-in used only while wizard/nvml.py's canonical fake is not written yet."""
    available, reason = True, None

    def __init__(self, n=8):
        self.n, self.calls = n, 0

    def devices(self):
        return [GpuStatic(i, "NVIDIA H100 80GB HBM3", 80 * 1024**3) for i in range(self.n)]

    def sample(self):
        self.calls += 1
        return [GpuSample(index=i, util=(self.calls * 7 + i * 13) % 101,
                          mem_used=(40 + i) * 1024**3, mem_total=80 * 1024**3,
                          power_w=300.0 + i, power_limit_w=700.0, temp_c=60 + i, sm_clock_mhz=1980,
                          processes=[GpuProcess(pid=1000 + i, used_memory=(39 + i) * 1024**3)])
                for i in range(self.n)]

    def close(self):
        pass


def _open(monkeypatch, spec):
    if spec is None:
        monkeypatch.delenv("WIZARD_FAKE_NVML", raising=False)
    else:
        monkeypatch.setenv("WIZARD_FAKE_NVML", spec)
    try:
        return open_nvml()
    except NotImplementedError:
        if spec is None:
            api = _InterimFake()
            api.available, api.reason = False, "NVML Shared Library Not Found"
            return api
        return _InterimFake()


@pytest.fixture
def fake8(monkeypatch):
    api = _open(monkeypatch, "8xH100-80GB")
    yield api
    api.close()


class OneMetricBroken:
    """The fake with GPU 3's power reading failing (NVML NotSupported), as on some SKUs/VMs."""

    def __init__(self, api):
        self._api = api
        self.available, self.reason = api.available, api.reason

    def __getattr__(self, name):
        return getattr(self._api, name)

    def sample(self):
        return [replace(s, power_w=None) if s.index == 3 else s for s in self._api.sample()]


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
        assert g["mem_total"] == 80 * 1024**3 or g["mem_total"] > 79 * 10**9
        assert 0 <= g["util"] <= 100
        assert 0 <= g["mem_used"] <= g["mem_total"]
    json.dumps(s)      # a sample is plain JSON


def test_processes_are_mapped_to_ranks(fake8):
    raw = fake8.sample()
    pids = [p.pid for s in raw for p in s.processes]
    if not pids:
        pytest.skip("this fake reports no GPU processes")
    mapping = {pid: i for i, pid in enumerate(pids)}
    s = Sampler(fake8, pid_to_rank=mapping.get).sample_once()
    ranks = [p["rank"] for g in s["gpus"] for p in g["processes"]]
    assert sorted(r for r in ranks if r is not None) == sorted(mapping.values())


def test_failing_pid_lookup_reads_as_no_rank(fake8):
    def broken(pid):
        raise ProcessLookupError(pid)
    s = Sampler(fake8, pid_to_rank=broken).sample_once()
    assert all(p["rank"] is None for g in s["gpus"] for p in g["processes"])


def test_a_failing_metric_is_none_and_the_rest_is_kept(fake8):
    s = Sampler(OneMetricBroken(fake8)).sample_once()
    assert s["available"] is True
    assert s["gpus"][3]["power_w"] is None
    assert s["gpus"][3]["util"] is not None
    assert all(g["power_w"] is not None for g in s["gpus"] if g["index"] != 3)


def test_unavailable_nvml_gives_the_message(monkeypatch):
    api = _open(monkeypatch, None)          # this machine has no NVIDIA driver
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


def test_callback_errors_do_not_kill_the_thread(fake8):
    calls = []

    def bad(sample):
        calls.append(sample)
        raise ValueError("disk full")
    with Sampler(fake8, interval=0.25, on_sample=bad) as sampler:
        time.sleep(0.6)
    assert len(calls) >= 2 and sampler.callback_errors == len(calls)


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
