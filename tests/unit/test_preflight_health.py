"""GPU health where NVML has it (issue 41): ECC errors, retired pages and remapped rows waiting for a reset, clocks
held down, XID errors (NVML's events while the collectives run, the kernel log since boot), and the drivers
compared across nodes. Through the fake NVML (wizard/probe/fake_nvml.py) and the node's own fact gathering."""

from __future__ import annotations

import json

import pytest

from wizard.preflight import health, node
from wizard.preflight.checks import FAIL, OK, WARN

KERNEL_LOG = [
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:5e:00): 13, Graphics Exception: ESR 0x404490=0x80000001",
    "NVRM: GPU at PCI:0000:3b:00: GPU-aaaa",
]


def fake(tmp_path, monkeypatch, devices: list[dict], **top) -> None:
    """A fake NVML of these devices; the kernel log is an empty file (never this machine's)."""
    (tmp_path / "kmsg").write_bytes(b"")
    monkeypatch.setattr(node, "KMSG", str(tmp_path / "kmsg"))
    spec = tmp_path / "nvml.json"
    spec.write_text(json.dumps({"devices": devices, **top}))
    monkeypatch.setenv("WIZARD_FAKE_NVML", str(spec))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_the_kernels_xid_lines_are_read_with_their_gpu():
    xids = health.parse_xids(KERNEL_LOG)
    assert [(x["pci"], x["xid"]) for x in xids] == [("0000:3b:00", 79), ("0000:3b:00", 79), ("0000:5e:00", 13)]


def test_a_healthy_fake_gpu_node_is_ok_and_says_what_it_could_not_read(tmp_path, monkeypatch):
    fake(tmp_path, monkeypatch, [{"gpu": "H100-80GB"}, {"gpu": "H100-80GB"}])
    facts = {"gpus": node.gpus()}
    assert len(facts["gpus"]["health"]) == 2 and facts["gpus"]["health"][0]["ecc_uncorrected_volatile"] == 0
    row = health.health_row(0, "n1", facts)
    assert row.status == OK and row.detail.startswith("2 GPUs: no uncorrectable ECC error")


@pytest.mark.parametrize("bad, status, words", [
    ({"ecc_uncorrected_volatile": 3}, FAIL, "GPU 1: 3 uncorrectable ECC errors since the driver loaded"),
    ({"remap_pending": True}, FAIL, "a row remap waits for a GPU reset"),
    ({"remap_failed": True}, FAIL, "could not be remapped"),
    ({"retired_pending": True}, FAIL, "a page retirement waits for a GPU reset"),
    ({"ecc_uncorrected_aggregate": 2}, WARN, "2 uncorrectable ECC errors in its life"),
    ({"clock_events": ["hw_thermal_slowdown", "gpu_idle"]}, WARN, "clocks held down (hardware thermal slowdown)"),
])
def test_each_health_finding_through_the_fake_nvml(tmp_path, monkeypatch, bad, status, words):
    fake(tmp_path, monkeypatch, [{"gpu": "H100-80GB"}, {"gpu": "H100-80GB", "health": bad}])
    row = health.health_row(3, "gpu004", {"gpus": node.gpus()})
    assert row.status == status and words in row.detail, row
    assert "--exclude=gpu004" in row.fix


def test_xids_in_the_kernel_log_warn_and_during_the_collectives_fail(tmp_path, monkeypatch):
    fake(tmp_path, monkeypatch, [{"gpu": "H100-80GB", "pci_bus_id": "00000000:3B:00.0"},
                                 {"gpu": "H100-80GB", "xid": [79]}])
    facts = {"gpus": {**node.gpus(), "kernel_xids": {"xids": health.parse_xids(KERNEL_LOG)}}}
    row = health.health_row(0, "n1", facts)
    assert row.status == WARN and "GPU 0: XID 79 (GPU has fallen off the bus) in the kernel log since boot, 2 times" \
        in row.detail and "XID 13" not in row.detail         # 13 is the program's, not the GPU's
    from wizard.probe.nvml import open_nvml
    watch = open_nvml().xid_watch()
    during = watch.poll()
    assert during == [(1, 79)]
    row = health.xid_row(0, "n1", [list(e) for e in during])
    assert row.status == FAIL and "XID 79" in row.detail and "during the preflight's collectives" in row.detail
    assert health.xid_row(0, "n1", [[0, 13]]) is None


def test_a_kernel_log_that_cannot_be_read_is_said(tmp_path, monkeypatch):
    fake(tmp_path, monkeypatch, [{"gpu": "H100-80GB"}])
    facts = {"gpus": {**node.gpus(), "kernel_xids": node.kernel_xids(str(tmp_path / "no-kmsg"))}}
    row = health.health_row(0, "n1", facts)
    assert row.status == OK and "kernel log not read" in row.detail and "past XIDs unknown" in row.detail


def gpu_node(driver: str, cuda: str, torch_cuda: str = "12.4") -> dict:
    return {"gpus": {"gpus": [{"index": 0, "name": "H100", "memory_total": 1}], "driver": driver, "cuda": cuda},
            "versions": {"torch_cuda": torch_cuda}}


def test_drivers_are_compared_across_nodes_and_against_torchs_cuda():
    per = {n: gpu_node("550.54.15", "12.4") for n in range(4)}
    per[2] = gpu_node("535.104.05", "12.2")
    rows = health.driver_rows(per, {n: f"n{n}" for n in range(4)})
    assert [(r.node, r.status) for r in rows] == [(2, WARN)]
    assert "3 of 4 nodes have 550.54.15 (CUDA 12.4)" in rows[0].detail
    old = health.driver_rows({0: gpu_node("470.82", "11.4", torch_cuda="12.8")}, {0: "n1"})
    assert old[0].status == FAIL and "cannot initialise CUDA" in old[0].detail
    assert health.driver_rows({0: {"gpus": {"gpus": []}}}, {0: "n1"}) == []
