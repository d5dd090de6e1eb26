"""Preflight's decisions on recorded facts: the NCCL / P2P ones (which only a GPU machine exercises for real), the
interface filters, IPv6-only resolution, versions, GPUs, limits, the all-reduce against the plan, the table.

The NCCL log lines are NCCL 2.x's own INFO/WARN lines as users posted them (NVIDIA/nccl #1267, #367, #1232, #188,
the two-interface one from #278); the interface and InfiniBand lists are those of an HGX H100 node (ip link: lo,
eno1, the eight ibp* IPoIB ports, docker0; /sys/class/infiniband: mlx5_0..mlx5_7) and of a cloud VM (lo, eth0).
"""

from __future__ import annotations

import pytest

from wizard.preflight import checks, figures, limits, measure, report
from wizard.preflight.checks import FAIL, INFO, OK, WARN, Expectation

HGX_IFACES = ["docker0", "eno1", "ibp12s0", "ibp139s0", "ibp154s0", "ibp170s0", "ibp192s0", "ibp206s0", "ibp220s0",
              "ibp64s0", "lo"]
HGX_HCAS = [f"mlx5_{i}" for i in range(8)]
VM_IFACES = ["eth0", "lo"]

NCCL_SOCKET_LOG = """\
instance-8g-96c-2:525781:525781 [0] NCCL INFO Bootstrap : Using ens7:10.128.0.31<0>
instance-8g-96c-2:525781:525781 [0] NCCL INFO NET/Plugin: Failed to find ncclNetPlugin_v7 symbol.
instance-8g-96c-2:525781:525781 [0] NCCL INFO cudaDriverVersion 12000
NCCL version 2.19.3+cuda12.3
instance-8g-96c-2:525781:525957 [0] NCCL INFO NET/IB : No device found.
instance-8g-96c-2:525781:525957 [0] NCCL INFO NET/Socket : Using [0]ens7:10.128.0.31<0>
instance-8g-96c-2:525781:525957 [0] NCCL INFO Using non-device net plugin version 0
instance-8g-96c-2:525781:525957 [0] NCCL INFO Using network Socket
"""
NCCL_WARN_LOG = """\
26a46eb2b1d3:111329:111329 [0] NCCL INFO Bootstrap : Using [0]eth0:172.17.0.2<0>
26a46eb2b1d3:111329:111329 [0] NCCL INFO NET/Plugin : No plugin found (libnccl-net.so).
26a46eb2b1d3:111329:111329 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
26a46eb2b1d3:111329:111329 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
26a46eb2b1d3:111336:111336 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
"""
NCCL_TWO_IFACES = ("sh-01:98911:98911 [0] NCCL INFO NET/Socket : Using [0]enP1p1s0f0:10.30.0.127<0> "
                   "[1]enP1p1s0f1:10.30.0.227<0>\n")


def facts(**parts):
    base = {"host": "n1", "versions": {}, "gpus": {"gpus": []}, "limits": {}, "net": {"interfaces": VM_IFACES,
            "ib_devices": [], "env": {}}}
    base.update(parts)
    return base


def exp(**kw) -> Expectation:
    base = dict(config_file="c.yaml", num_machines=2, processes_per_node=8, uses_gpus=True, main_ip="10.0.0.1",
                main_port=29500)
    base.update(kw)
    return Expectation(**base)


def gpu(i, name="NVIDIA H100 80GB HBM3", mem=80 << 30, free=None):
    return {"index": i, "name": name, "memory_total": mem, "memory_free": mem if free is None else free}


# ----------------------------------------------------------------------------- interface filters (NCCL syntax)


@pytest.mark.parametrize("value, names, chosen", [
    ("eth", VM_IFACES, ["eth0"]),                       # a prefix
    ("=eth", VM_IFACES, []),                            # exact: no interface is called "eth"
    ("=eth0", VM_IFACES, ["eth0"]),
    ("^lo,docker", HGX_IFACES, [n for n in HGX_IFACES if n not in ("lo", "docker0")]),   # NCCL's default
    ("^=docker", HGX_IFACES, HGX_IFACES),         # exact exclude of "docker": docker0 (and lo: no default) stay
    ("ib", HGX_IFACES, [n for n in HGX_IFACES if n.startswith("ib")]),
    ("en,eth,em,bond", ["enp10s0", "lo"], ["enp10s0"]),       # NVIDIA/nccl#1232's value
    ("mlx5_0:1,mlx5_3:1", HGX_HCAS, ["mlx5_0", "mlx5_3"]),    # an IB HCA list with ports
])
def test_nccl_interface_filters(value, names, chosen):
    assert checks.matching(names, value) == chosen


def test_socket_ifname_naming_a_missing_interface_fails_with_the_ones_there():
    f = facts(net={"interfaces": VM_IFACES, "ib_devices": [], "env": {"NCCL_SOCKET_IFNAME": "ens7"}})
    (row,) = checks.nccl_env_rows(1, "n2", exp(), f)
    assert row.status == FAIL and "'ens7' names no interface" in row.detail and "eth0, lo" in row.detail
    assert "eth0" in row.fix


def test_socket_ifname_selecting_only_loopback_fails_across_machines():
    f = facts(net={"interfaces": VM_IFACES, "ib_devices": [], "env": {"NCCL_SOCKET_IFNAME": "lo"}})
    (row,) = checks.nccl_env_rows(0, "n1", exp(), f)
    assert row.status == FAIL and "loopback" in row.detail


def test_socket_ifname_that_matches_is_shown_with_what_it_selects():
    f = facts(net={"interfaces": HGX_IFACES, "ib_devices": HGX_HCAS, "env": {"NCCL_SOCKET_IFNAME": "^lo,docker"}})
    (row,) = checks.nccl_env_rows(0, "n1", exp(), f)
    assert row.status == OK and "eno1" in row.detail and "docker0" not in row.detail


def test_ib_hca_naming_a_missing_device_fails_and_names_the_devices_there():
    f = facts(net={"interfaces": HGX_IFACES, "ib_devices": HGX_HCAS, "env": {"NCCL_IB_HCA": "=mlx5_8"}})
    (row,) = checks.nccl_env_rows(0, "n1", exp(), f)
    assert row.status == FAIL and "mlx5_0" in row.fix


def test_ib_hca_on_a_node_without_infiniband_warns_and_is_ignored_when_ib_is_disabled():
    f = facts(net={"interfaces": VM_IFACES, "ib_devices": [], "env": {"NCCL_IB_HCA": "mlx5"}})
    (row,) = checks.nccl_env_rows(0, "n1", exp(), f)
    assert row.status == WARN and "NCCL_IB_DISABLE=1" in row.fix
    f["net"]["env"]["NCCL_IB_DISABLE"] = "1"
    assert checks.nccl_env_rows(0, "n1", exp(), f) == []


def test_gloo_socket_ifname_must_name_an_interface():
    f = facts(net={"interfaces": VM_IFACES, "ib_devices": [], "env": {"GLOO_SOCKET_IFNAME": "eth1"}})
    (row,) = checks.nccl_env_rows(0, "n1", exp(uses_gpus=False), f)
    assert row.status == FAIL and "eth1" in row.detail


# ----------------------------------------------------------------------------- NCCL's log


def test_nccl_log_names_version_network_and_interface():
    got = checks.parse_nccl_log(NCCL_SOCKET_LOG)
    assert got["version"] == "2.19.3+cuda12.3" and got["network"] == "Socket"
    assert got["socket"] == "[0]ens7:10.128.0.31<0>" and got["warnings"] == []


def test_nccl_log_keeps_each_warning_once_and_every_interface():
    got = checks.parse_nccl_log(NCCL_WARN_LOG)
    assert got["warnings"] == ["Failed to open libibverbs.so[.1]"]
    assert "enP1p1s0f1" in checks.parse_nccl_log(NCCL_TWO_IFACES)["socket"]


def run_(nbytes, gbps, seconds=0.01, samples=10, low=None, high=None, check="ok"):
    return {"bytes": nbytes, "samples": samples, "seconds": seconds, "busbw_gbps": gbps,
            "low_gbps": gbps if low is None else low, "high_gbps": gbps if high is None else high, "check": check}


def scope(ranks, gbps, **ops):
    """A collective scope as collective.time_scope reports it: every op at 16 MiB and 256 MiB."""
    out = {"ranks": ranks, "ops": {}}
    for op in measure.OPS:
        g = ops.get(op, gbps)
        out["ops"][op] = [run_(16 << 20, g / 2), run_(256 << 20, g)]
    return out


def test_collective_rows_show_the_nccl_network_and_its_warnings():
    result = {"scopes": {"node": scope(8, 3131.0), "across": scope(2, 160.2)},
              "nccl_log": checks.parse_nccl_log(NCCL_SOCKET_LOG + NCCL_WARN_LOG)}
    rows = figures.collective_rows(0, "n1", exp(assumed_gbps=3200, assumed_source="8 x 400 Gb/s"), result, "nccl")
    across = next(r for r in rows if r.check == "all-reduce across nodes")
    assert across.status == WARN and "via Socket ([0]ens7:10.128.0.31<0>)" in across.detail
    assert "5% of it" in across.detail
    assert "--record" in across.fix
    assert any(r.check == "NCCL warning" and "libibverbs" in r.detail for r in rows)


# ----------------------------------------------------------------------------- P2P


def hgx_facts(consumer=False, nvlink=True, n=2, name="NVIDIA H100 80GB HBM3"):
    return facts(gpus={"gpus": [gpu(i, name) for i in range(n)], "nvlink": nvlink, "consumer": consumer,
                       "p2p": [["X" if i == j else "OK" for j in range(n)] for i in range(n)]})


def test_p2p_copy_that_hung_fails_and_suggests_disabling_p2p_on_that_node():
    row = checks.p2p_row(0, "n1", hgx_facts(consumer=True, nvlink=False, name="NVIDIA GeForce RTX 4090"),
                         {"0-1": "hung"}, {})
    assert row.status == FAIL and "0-1 hung" in row.detail and "NCCL_P2P_DISABLE=1" in row.fix


def test_p2p_copy_with_wrong_data_fails_too():
    row = checks.p2p_row(0, "n1", hgx_facts(consumer=True, nvlink=False), {"0-1": "ok", "0-2": "mismatch"}, {})
    assert row.status == FAIL and "0-2" in row.detail and "mismatch" in row.detail


def test_p2p_failure_already_disabled_is_a_warning_without_a_fix():
    row = checks.p2p_row(0, "n1", hgx_facts(consumer=True, nvlink=False), {"0-1": "hung"}, {"NCCL_P2P_DISABLE": "1"})
    assert row.status == WARN and row.fix is None


def test_p2p_that_works_is_never_told_to_disable_it_and_a_needless_disable_on_nvlink_warns():
    ok = checks.p2p_row(0, "n1", hgx_facts(), {"0-1": "ok"}, {})
    assert ok.status == OK and "NVLink" in ok.detail and not ok.fix
    needless = checks.p2p_row(0, "n1", hgx_facts(), {"0-1": "ok"}, {"NCCL_P2P_DISABLE": "1"})
    assert needless.status == WARN and "unset NCCL_P2P_DISABLE" in needless.fix


def test_p2p_untested_on_consumer_gpus_the_driver_allows_warns():
    row = checks.p2p_row(0, "n1", hgx_facts(consumer=True, nvlink=False), None, {})
    assert row.status == WARN and "NCCL_P2P_DISABLE=1" in row.fix
    assert checks.p2p_row(0, "n1", facts(gpus={"gpus": [gpu(0)]}), None, {}) is None      # one GPU: no pair


# ----------------------------------------------------------------------------- reachability


def test_ipv6_only_resolution_of_the_main_host_fails():
    row = checks.resolution_row(1, "n2", "main.cluster", {"resolve": {"addresses": [[6, "fd00::1"]]}})
    assert row.status == FAIL and "IPv6 only" in row.detail and "IPv4" in row.fix
    both = checks.resolution_row(1, "n2", "main.cluster", {"resolve": {"addresses": [[4, "10.0.0.1"], [6, "fd00::1"]]}})
    assert both.status == OK


def test_unresolvable_or_hanging_resolution_fails():
    assert checks.resolution_row(1, "n2", "nope", {"resolve": {"error": "Name or service not known"}}).status == FAIL
    hung = checks.resolution_row(1, "n2", "slowdns", {"resolve": {"timeout": 20.0}})
    assert hung.status == FAIL and "hung" in hung.detail


@pytest.mark.parametrize("kind, words", [("foreign", "held by another program"), ("refused", "refused"),
                                         ("timeout", "could not be reached"), ("self", "not this (main) node")])
def test_each_way_the_main_port_is_not_reached_has_its_own_words_and_a_fix(kind, words):
    row = checks.reach_row(1, "n2", "10.0.0.1", 29500, {"kind": kind, "seconds": 20.0})
    assert row.status == FAIL and words in row.detail and row.fix


def test_a_node_that_never_joined_and_a_duplicate_rank_are_named():
    rows = checks.joined_rows(3, {0: "n1", 1: "n2"}, [1], 20.0, "n1")
    assert [(r.node, r.status) for r in rows] == [(1, FAIL), (2, FAIL)]
    assert "two nodes say they are machine_rank 1" in rows[0].detail
    assert "--machine-rank 2" in rows[1].fix


# ----------------------------------------------------------------------------- versions


def versions(peft="0.21.2", path="/venv/site-packages/peft"):
    return {"versions": {"python": "3.11.7", "torch": {"version": "2.13.0+cu128"},
                         "accelerate": {"version": "1.16.0"}, "deepspeed": {"version": "0.19.8"},
                         "transformers": {"version": "5.25.0"}, "peft": {"version": peft, "path": path},
                         "torch_cuda": "12.8", "nccl": "2.27.3"}}


def test_a_differing_package_fails_on_the_node_that_differs_with_the_pin_to_install():
    rows = checks.version_rows({0: versions(), 1: versions("0.0.1", "/shim/peft")}, {0: "n1", 1: "n2"})
    ref, other = rows
    assert ref.status == INFO and "node 1 differs" in ref.detail
    assert other.status == FAIL and "peft 0.0.1 (node 0: 0.21.2)" in other.detail and "/shim/peft" in other.detail
    assert other.fix.endswith("peft==0.21.2")
    table = report.render_versions({0: versions(), 1: versions("0.0.1")})
    assert any(line.startswith("* peft") and "0.0.1" in line for line in table)


def test_at_scale_the_node_that_differs_from_most_is_named_not_the_others():
    per = {n: versions() for n in range(8)}
    per[0] = versions("0.0.1", "/shim/peft")             # the main node is the odd one out
    rows = checks.version_rows(per, {n: f"n{n}" for n in range(8)})
    assert [r.node for r in rows if r.status == FAIL] == [0]
    assert "differs from 7 of 8 nodes: peft 0.0.1 (7 of 8 nodes: 0.21.2)" in rows[0].detail


def test_same_versions_are_one_ok_row_per_node_and_no_table():
    rows = checks.version_rows({0: versions(), 1: versions()}, {0: "n1", 1: "n2"})
    assert [r.status for r in rows] == [OK, OK] and report.render_versions({0: versions(), 1: versions()}) == []
    assert "(same on every node)" in rows[0].detail


def test_versions_of_the_nodes_that_reported_are_not_called_every_nodes():
    (row,) = checks.version_rows({0: versions()}, {0: "n1"}, expected=2)
    assert "same on the 1 node that reported; 1 did not" in row.detail and "every node" not in row.detail


# ----------------------------------------------------------------------------- GPUs


def test_gpu_ids_naming_a_gpu_the_node_lacks_fail():
    f = facts(gpus={"gpus": [gpu(i) for i in range(4)], "driver": "550.54.15", "cuda": "12.4"})
    (row,) = checks.gpu_rows(1, "n2", exp(processes_per_node=2, gpu_ids=[4, 5]), f)
    assert row.status == FAIL and "this node has 4 GPUs" in row.detail and "driver 550.54.15" in row.detail


def test_fewer_gpus_than_processes_or_less_memory_than_the_plan_fail():
    f = facts(gpus={"gpus": [gpu(i) for i in range(4)], "driver": "550", "cuda": "12.4"})
    (few,) = checks.gpu_rows(1, "n2", exp(processes_per_node=8), f)
    assert few.status == FAIL and "8 processes per node" in few.detail
    small = facts(gpus={"gpus": [gpu(i, "NVIDIA A100-SXM4-40GB", 40 << 30) for i in range(8)]})
    (row,) = checks.gpu_rows(1, "n2", exp(per_gpu_bytes=60 << 30), small)
    assert row.status == FAIL and "the plan needs 60.0 GiB per GPU" in row.detail


def test_matching_gpus_show_count_model_memory_driver_and_cuda():
    f = facts(gpus={"gpus": [gpu(i) for i in range(8)], "driver": "550.54.15", "cuda": "12.4"})
    (row,) = checks.gpu_rows(0, "n1", exp(per_gpu_bytes=60 << 30, gpu_capacity_bytes=80 << 30), f)
    assert row.status == OK
    assert row.detail.startswith("8 x NVIDIA H100 80GB HBM3 (80.0 GiB); driver 550.54.15, CUDA 12.4")


def test_nodes_with_another_gpu_model_warn():
    per = {0: facts(gpus={"gpus": [gpu(0)]}), 1: facts(gpus={"gpus": [gpu(0, "NVIDIA A100-SXM4-80GB")]})}
    (row,) = checks.gpus_agree_rows(per, {0: "n1", 1: "n2"}, exp())
    assert row.node == 1 and row.status == WARN


# ----------------------------------------------------------------------------- limits


def offload_exp(**kw):
    return exp(processes_per_node=8, pin_default_blocks=["optimizer"], params=8_000_000_000, **kw)


def test_memlock_under_what_the_offload_pins_fails_where_deepspeed_pins_by_default():
    f = facts(versions={"deepspeed": {"version": "0.19.8"}}, limits={"memlock": 64 << 20})
    row = limits.memlock_row(0, "n1", offload_exp(), f)
    # 4 B x 8e9 / 16 processes = 2 GB each
    assert row.status == FAIL and "pins at least 1.9 GiB" in row.detail and "ulimit -l unlimited" in row.fix


def test_memlock_before_deepspeed_pinned_by_default_or_unlimited_is_fine():
    assert limits.memlock_row(0, "n1", offload_exp(), facts(versions={"deepspeed": {"version": "0.19.4"}},
                                                           limits={"memlock": 64 << 20})).status == OK
    assert limits.memlock_row(0, "n1", offload_exp(), facts(versions={"deepspeed": {"version": "0.19.8"}},
                                                           limits={"memlock": None})).status == OK


def test_host_ram_under_the_plans_offload_need_fails():
    f = facts(limits={"ram_total": 64 << 30, "ram_available": 40 << 30, "memlock": None, "shm_total": 32 << 30,
                      "cwd": "/w", "disk": {"/w": 1 << 40}})
    rows = limits.limit_rows(0, "n1", exp(host_ram_bytes=100 << 30), f)
    ram = next(r for r in rows if r.check == "host RAM")
    assert ram.status == FAIL and "100.0 GiB" in ram.detail and "--mem" in ram.fix


def test_a_containers_64_mib_shm_fails_with_several_gpus_per_node():
    row = limits.shm_row(0, "n1", exp(), {"shm_total": 64 << 20})
    assert row.status == FAIL and "--shm-size" in row.fix
    assert limits.shm_row(0, "n1", exp(processes_per_node=1), {"shm_total": 64 << 20}).status == WARN


def test_nvme_disk_short_of_the_plan_fails():
    nvme = limits.nvme_row(0, "n1", exp(nvme_path="/nvme", nvme_bytes=2 << 40),
                           {"cwd": "/w", "disk": {"/w": 1 << 40, "/nvme": 1 << 40}})
    assert nvme.status == FAIL and "the plan needs 2.0 TiB" in nvme.detail


# ----------------------------------------------------------------------------- collectives, verdict, table


def test_bus_bandwidth_is_nccl_tests_definition():
    gbps = (1 << 30) * 8 / 1e9
    assert measure.busbw_gbps("all_reduce", 1 << 30, 1.0, 2) == pytest.approx(gbps)     # 2 ranks: busbw = algbw
    assert measure.busbw_gbps("all_reduce", 1 << 30, 1.0, 8) == pytest.approx(gbps * 1.75)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):           # (n-1)/n of the op's size
        assert measure.busbw_gbps(op, 1 << 30, 1.0, 8) == pytest.approx(gbps * 7 / 8)
    assert measure.busbw_gbps("all_reduce", 1 << 30, 1.0, 1) == 0.0


def test_a_hung_collective_is_a_finding():
    (row,) = figures.collective_rows(0, "n1", exp(), {"timeout": 150.0}, "nccl")
    assert row.status == FAIL and "did not finish within 150 s" in row.detail


def test_verdict_and_exit_code():
    rows = [checks.Row(0, "n1", "a", OK, "x"), checks.Row(1, "n2", "b", WARN, "y", "z")]
    assert report.exit_code(rows) == 0 and report.verdict(rows, 2) == "preflight: all clear on 2 nodes, 1 warning"
    rows.append(checks.Row(1, "n2", "reach main port", FAIL, "no", "fix it"))
    assert report.exit_code(rows) == 1
    assert report.verdict(rows, 2).startswith("preflight: 1 finding that stops the run (first: node 1 reach main port)")


def test_the_table_puts_each_fix_under_its_finding():
    lines = report.render_table([checks.Row(0, "n1", "GPUs", OK, "8 x H100"),
                                 checks.Row(1, "n2", "reach main port", FAIL, "refused", "open the port")])
    assert lines[0].split() == ["node", "check", "result"]
    assert "FAIL" in lines[2] and lines[3].strip() == "fix: open the port"


def test_a_gpu_config_on_nodes_without_gpus_warns_and_runs_gloo_but_a_node_without_beside_nodes_with_fails():
    none = facts(gpus={"gpus": [], "reason": "NVML Shared Library Not Found"})
    (row,) = checks.gpu_rows(0, "n1", exp(processes_per_node=1), none)
    assert row.status == WARN and "on the CPU over gloo" in row.detail
    assert checks.backend_for(exp(), {0: none, 1: none}) == "gloo"
    with_gpu = facts(gpus={"gpus": [gpu(0)]})
    assert checks.backend_for(exp(), {0: with_gpu, 1: with_gpu}) == "nccl"
    assert checks.backend_for(exp(uses_gpus=False), {0: with_gpu}) == "gloo"
    assert checks.backend_for(exp(), {0: with_gpu, 1: none}) == "gloo"
    (mixed,) = checks.gpus_agree_rows({0: with_gpu, 1: none}, {0: "n1", 1: "n2"}, exp())
    assert mixed.node == 1 and mixed.status == FAIL and "cannot join" in mixed.detail
