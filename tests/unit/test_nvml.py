"""wizard.probe.nvml: the real binding's N/A handling (pynvml functions monkeypatched), the
unavailable API, the deterministic fake and the CUDA_VISIBLE_DEVICES mapping."""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import pynvml
import pytest

from tests.markers import needs_no_driver
from wizard.errors import InputError
from wizard.probe import catalogue
from wizard.probe.fake_nvml import FakeNvml, fake_from_spec
from wizard.probe.nvml import (
    FAKE_ENV,
    GpuSample,
    GpuStatic,
    RealNvml,
    UnavailableNvml,
    init_failure_reason,
    open_nvml,
    visible_devices,
)

GiB = 1024**3


# --------------------------------------------------------------------------------------------
# open_nvml and the real library on this machine (no driver)

@needs_no_driver
def test_open_nvml_without_driver_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.delenv(FAKE_ENV, raising=False)
    api = open_nvml()
    assert isinstance(api, RealNvml)
    assert api.available is False
    assert api.reason == "NVML Shared Library Not Found: no NVIDIA driver on this machine"
    assert api.devices() == [] and api.sample() == []
    assert api.driver_version() is None and api.cuda_version() is None
    assert api.p2p_matrix() is None and api.nvlink_all() is None
    api.close()
    api.close()


@needs_no_driver
def test_empty_fake_variable_means_the_real_library(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "  ")
    assert isinstance(open_nvml(), RealNvml)


def test_fake_variable_selects_the_fake(monkeypatch):
    monkeypatch.setenv(FAKE_ENV, "2xA100-40GB")
    assert isinstance(open_nvml(), FakeNvml)


# --------------------------------------------------------------------------------------------
# RealNvml against monkeypatched pynvml functions (the real NVMLError classes)

def _err(code):
    return pynvml.NVMLError(code)


class FakeDriver:
    """Installs pynvml functions that behave like a 2-GPU H100 box, with some metrics unsupported."""

    def __init__(self, monkeypatch, n=2, failing=(), p2p_nvlink_supported=False):
        self.n = n
        self.failing = set(failing)           # function names that raise NotSupported
        self.shutdowns = 0
        self.inside = 0                       # concurrent callers seen inside a pynvml function
        self.max_inside = 0
        self.caps_seen = []
        self.p2p_nvlink_supported = p2p_nvlink_supported
        funcs = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": self._shutdown,
            "nvmlDeviceGetCount": lambda: self.n,
            "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
            "nvmlSystemGetDriverVersion": lambda: "550.54.15",
            "nvmlSystemGetCudaDriverVersion": lambda: 12040,
            "nvmlDeviceGetName": lambda h: b"NVIDIA H100 80GB HBM3",
            "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=81559 * 2**20, used=2 * GiB,
                                                                 free=81559 * 2**20 - 2 * GiB),
            "nvmlDeviceGetUUID": lambda h: f"GPU-0000000{h[1]}-aaaa-bbbb-cccc-dddddddddddd",
            "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=f"00000000:{18 + int(h[1])}:00.0".encode()),
            "nvmlDeviceGetCudaComputeCapability": lambda h: (9, 0),
            "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=42, memory=10),
            "nvmlDeviceGetPowerUsage": lambda h: 350123,
            "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700000,
            "nvmlDeviceGetPowerManagementLimit": lambda h: 690000,
            "nvmlDeviceGetTemperatureV": lambda h, sensor: 61,
            "nvmlDeviceGetTemperature": lambda h, sensor: 60,
            "nvmlDeviceGetClockInfo": lambda h, kind: 1980,
            "nvmlDeviceGetComputeRunningProcesses": lambda h: [SimpleNamespace(pid=1234, usedGpuMemory=GiB),
                                                               SimpleNamespace(pid=99, usedGpuMemory=None)],
            "nvmlDeviceGetP2PStatus": self._p2p,
            "nvmlDeviceGetNvLinkState": lambda h, link: 1 if link < 18 else (_ for _ in ()).throw(
                _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)),
        }
        for name, fn in funcs.items():
            monkeypatch.setattr(pynvml, name, self._wrap(name, fn))

    def _wrap(self, name, fn):
        def call(*args):
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)
            try:
                time.sleep(0)                 # give other threads a chance to collide
                if name in self.failing:
                    raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
                return fn(*args)
            finally:
                self.inside -= 1
        return call

    def _shutdown(self):
        self.shutdowns += 1

    def _p2p(self, h1, h2, cap):
        self.caps_seen.append(cap)
        if cap == pynvml.NVML_P2P_CAPS_INDEX_NVLINK and not self.p2p_nvlink_supported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return pynvml.NVML_P2P_STATUS_OK


def test_real_binding_reads_a_working_driver(monkeypatch):
    FakeDriver(monkeypatch)
    api = RealNvml()
    assert api.available and api.reason is None
    assert api.driver_version() == "550.54.15"
    assert api.cuda_version() == "12.4"
    d = api.devices()
    assert [x.index for x in d] == [0, 1]
    assert d[0].name == "NVIDIA H100 80GB HBM3"                 # bytes decoded
    assert d[0].memory_total == 81559 * 2**20
    assert d[1].pci_bus_id == "00000000:19:00.0"
    assert d[0].compute_capability == (9, 0)
    s = api.sample()[0]
    assert s.util == 42 and s.mem_used == 2 * GiB and s.mem_total == 81559 * 2**20
    assert s.power_w == pytest.approx(350.123) and s.power_limit_w == pytest.approx(700.0)   # mW -> W
    assert s.temp_c == 61 and s.sm_clock_mhz == 1980
    assert [(p.pid, p.used_memory) for p in s.processes] == [(1234, GiB), (99, None)]
    api.close()


def test_not_supported_metrics_read_as_none(monkeypatch):
    drv = FakeDriver(monkeypatch, failing={
        "nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit",
        "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
        "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUUID", "nvmlSystemGetCudaDriverVersion"})
    api = RealNvml()
    s = api.sample()[1]
    assert s.power_w is None and s.power_limit_w is None and s.sm_clock_mhz is None and s.temp_c is None
    assert s.processes == []
    assert s.util == 42                                         # the rest still reads
    assert api.devices()[0].uuid is None
    assert api.cuda_version() is None
    assert drv.shutdowns == 0
    api.close()
    api.close()
    assert drv.shutdowns == 1                                   # one init, one shutdown


def install(monkeypatch, **funcs) -> None:
    for name, fn in funcs.items():
        monkeypatch.setattr(pynvml, name, fn, raising=False)


def test_real_binding_reads_each_gpus_health(monkeypatch):
    """ECC counters by error type and counter, retired pages by cause, remapped rows (corr, unc, pending, failure),
    the clock event reasons' bits, each from NVML's own calls and constants."""
    FakeDriver(monkeypatch)

    def ecc(h, kind, counter):
        return {(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 2 if h == "h1" else 0,
                (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 5,
                (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 7}[(kind, counter)]
    install(monkeypatch, nvmlDeviceGetTotalEccErrors=ecc, nvmlDeviceGetEccMode=lambda h: [1, 1],
            nvmlDeviceGetRetiredPages=lambda h, cause: [0x1000] if cause == pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR else [],
            nvmlDeviceGetRetiredPagesPendingStatus=lambda h: 0,
            nvmlDeviceGetRemappedRows=lambda h: (1, 0, 1 if h == "h1" else 0, 0),
            nvmlDeviceGetCurrentClocksEventReasons=lambda h: pynvml.nvmlClocksEventReasonHwThermalSlowdown
            | pynvml.nvmlClocksEventReasonGpuIdle)
    api = RealNvml()
    h0, h1 = api.health()
    assert (h0.ecc_enabled, h0.ecc_uncorrected_volatile, h0.ecc_uncorrected_aggregate, h0.ecc_corrected_volatile) == \
        (True, 0, 5, 7)
    assert h1.ecc_uncorrected_volatile == 2 and h1.remap_pending is True and h0.remap_pending is False
    assert h0.retired_pages == 1 and h0.retired_pending is False and h0.remapped_correctable == 1
    assert h0.clock_events == ("gpu_idle", "hw_thermal_slowdown")
    api.close()


def test_health_that_nvml_cannot_read_is_none_and_the_older_throttle_call_answers(monkeypatch):
    FakeDriver(monkeypatch, failing={"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                                     "nvmlDeviceGetRetiredPages", "nvmlDeviceGetCurrentClocksEventReasons"})
    install(monkeypatch, nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: pynvml.nvmlClocksThrottleReasonSwPowerCap)
    (h, _) = RealNvml().health()
    assert h.ecc_uncorrected_volatile is None and h.remap_pending is None and h.retired_pages is None
    assert h.clock_events == ("sw_power_cap",)


def test_xid_events_are_read_from_nvmls_event_set(monkeypatch):
    FakeDriver(monkeypatch)
    events = [SimpleNamespace(device="h1", eventData=79)]
    registered = []
    install(monkeypatch, nvmlEventSetCreate=lambda: "set",
            nvmlDeviceRegisterEvents=lambda h, kind, es: registered.append((h, kind)),
            nvmlEventSetWait_v2=lambda es, ms: events.pop() if events else (_ for _ in ()).throw(
                _err(pynvml.NVML_ERROR_TIMEOUT)),
            nvmlDeviceGetIndex=lambda h: int(h[1]), nvmlEventSetFree=lambda es: None)
    watch = RealNvml().xid_watch()
    assert registered == [("h0", pynvml.nvmlEventTypeXidCriticalError), ("h1", pynvml.nvmlEventTypeXidCriticalError)]
    assert watch.poll() == [(1, 79)] and watch.poll() == []
    watch.close()


def test_fallbacks_to_older_calls(monkeypatch):
    FakeDriver(monkeypatch, failing={"nvmlDeviceGetTemperatureV", "nvmlDeviceGetEnforcedPowerLimit"})
    s = RealNvml().sample()[0]
    assert s.temp_c == 60                                       # deprecated GetTemperature
    assert s.power_limit_w == pytest.approx(690.0)              # GetPowerManagementLimit


def test_every_metric_failing_never_raises(monkeypatch):
    FakeDriver(monkeypatch)
    for name in dir(pynvml):
        if name.startswith("nvmlDeviceGet") and name not in ("nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"):
            monkeypatch.setattr(pynvml, name, lambda *a: (_ for _ in ()).throw(_err(pynvml.NVML_ERROR_GPU_IS_LOST)))
    api = RealNvml()
    samples = api.sample()
    assert [s.index for s in samples] == [0, 1]
    assert all(s.util is None and s.mem_used is None and s.power_w is None and s.processes == [] for s in samples)
    assert api.devices()[0].name == "GPU 0" and api.devices()[0].memory_total == 0
    assert api.p2p_matrix() is None and api.nvlink_all() is None


def test_unexpected_exception_types_read_as_none(monkeypatch):
    FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: 1 / 0)
    assert RealNvml().sample()[0].util is None


def test_an_odd_process_answer_makes_that_gpu_n_a_not_a_crash(monkeypatch):
    FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses",
                        lambda h: [SimpleNamespace(pid="not a pid", usedGpuMemory=GiB)] if h == "h1" else [])
    samples = RealNvml().sample()
    assert samples[0].util == 42
    assert samples[1] == GpuSample(index=1)


def test_a_failing_shutdown_still_closes(monkeypatch):
    drv = FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: (_ for _ in ()).throw(_err(pynvml.NVML_ERROR_UNINITIALIZED)))
    api = RealNvml()
    api.close()
    assert api.available is False and api.sample() == [] and drv.shutdowns == 0


def test_p2p_matrix_and_nvlink_from_link_states(monkeypatch):
    drv = FakeDriver(monkeypatch, n=3)
    api = RealNvml()
    assert api.p2p_matrix() == [["X", "OK", "OK"], ["OK", "X", "OK"], ["OK", "OK", "X"]]
    assert api.p2p_matrix([2, 0]) == [["X", "OK"], ["OK", "X"]]
    # nvidia-ml-py 13 defines NVML_P2P_CAPS_INDEX_READ as a tuple; the binding must pass an int.
    assert all(isinstance(c, int) for c in drv.caps_seen)
    assert api.nvlink_all() is True                             # P2P-over-NVLink unsupported -> link states
    assert api.nvlink_all([1]) is None                          # one GPU: no pairs


def test_nvlink_from_p2p_nvlink_status(monkeypatch):
    FakeDriver(monkeypatch, p2p_nvlink_supported=True)
    assert RealNvml().nvlink_all() is True
    monkeypatch.setattr(pynvml, "nvmlDeviceGetP2PStatus",
                        lambda a, b, cap: pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
                        if cap == pynvml.NVML_P2P_CAPS_INDEX_NVLINK else pynvml.NVML_P2P_STATUS_OK)
    assert RealNvml().nvlink_all() is False


def test_no_active_links_means_no_nvlink(monkeypatch):
    FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", lambda h, link: 0)
    assert RealNvml().nvlink_all() is False


def test_p2p_status_codes_are_named(monkeypatch):
    FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetP2PStatus",
                        lambda a, b, cap: pynvml.NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED)
    assert RealNvml().p2p_matrix() == [["X", "CNS"], ["CNS", "X"]]


def test_calls_are_serialised_for_a_background_sampler(monkeypatch):
    drv = FakeDriver(monkeypatch, n=4)
    api = RealNvml()
    errors = []

    def hammer():
        try:
            for _ in range(30):
                assert len(api.sample()) == 4
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert drv.max_inside == 1


@pytest.mark.parametrize("error, expected", [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found: no NVIDIA driver on this machine"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded: the NVIDIA kernel driver is not loaded"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
    (pynvml.NVML_ERROR_UNKNOWN, "Unknown Error"),
])
def test_init_failure_gives_unavailable_with_one_line_reason(monkeypatch, error, expected):
    def fail():
        raise _err(error)
    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    api = RealNvml()
    assert api.available is False
    assert expected in api.reason and "\n" not in api.reason
    assert api.sample() == [] and api.devices() == []


def test_device_listing_failure_is_unavailable(monkeypatch):
    drv = FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: (_ for _ in ()).throw(_err(pynvml.NVML_ERROR_UNKNOWN)))
    api = RealNvml()
    assert api.available is False and api.reason.startswith("NVML could not list the GPUs")
    assert drv.shutdowns == 1


def test_clobbered_pynvml_is_detected(monkeypatch):
    monkeypatch.delattr(pynvml, "nvmlInitWithFlags")
    api = RealNvml()
    assert api.available is False and "nvidia-ml-py" in api.reason and "clobbered" in api.reason


def test_missing_binding_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)          # `import pynvml` raises ImportError
    api = RealNvml()
    assert api.available is False and "nvidia-ml-py is not installed" in api.reason


def test_init_failure_reason_for_plain_exceptions():
    assert init_failure_reason(OSError("boom")) == "boom"
    assert init_failure_reason(RuntimeError()) == "RuntimeError"


# --------------------------------------------------------------------------------------------
# The fake

def test_fake_from_catalogue_spec():
    api = fake_from_spec("8xH100-80GB")
    spec = catalogue.lookup("H100-80GB")
    devices = api.devices()
    assert [d.index for d in devices] == list(range(8))
    assert {d.name for d in devices} == {"NVIDIA H100 80GB HBM3"}
    assert all(d.memory_total == spec.memory and d.compute_capability == (9, 0) for d in devices)
    assert len({d.uuid for d in devices}) == 8 and all(d.uuid.startswith("GPU-") for d in devices)
    assert len({d.uuid[:12] for d in devices}) == 8             # distinct short prefixes, as in real life
    assert len({d.pci_bus_id for d in devices}) == 8
    assert api.available and api.driver_version() == "550.54.15" and api.cuda_version() == "12.4"
    assert api.nvlink_all() is True
    assert all(c == ("X" if i == j else "OK") for i, row in enumerate(api.p2p_matrix()) for j, c in enumerate(row))


def test_fake_samples_move_and_are_deterministic():
    a, b = fake_from_spec("4xA100-80GB,seed=3"), fake_from_spec("4xA100-80GB,seed=3")
    seq_a = [a.sample() for _ in range(12)]
    seq_b = [b.sample() for _ in range(12)]
    assert seq_a == seq_b
    utils = [s[0].util for s in seq_a]
    assert len(set(utils)) > 5 and all(0 <= u <= 100 for u in utils)
    other = [s[0].util for s in (fake_from_spec("4xA100-80GB,seed=4").sample() for _ in range(12))]
    assert other != utils
    s = seq_a[5][2]
    assert 0 < s.mem_used < s.mem_total and 0 < s.power_w <= s.power_limit_w == 400.0
    assert s.temp_c > 20 and s.sm_clock_mhz > 0


def test_fake_frozen_repeats_one_sample():
    api = fake_from_spec("2xL40S,frozen")
    first = api.sample()
    assert all(api.sample() == first for _ in range(5))


def test_fake_idle_is_an_idle_machine():
    s = fake_from_spec("2xH100-80GB,idle").sample()[0]
    assert s.util == 0 and s.mem_used < s.mem_total // 100


def test_fake_mixed_and_options():
    api = fake_from_spec("1xA100-80GB+1xA100-40GB,driver=535.104.05,cuda=12.2,nvlink=no")
    assert [d.name for d in api.devices()] == ["NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"]
    assert api.driver_version() == "535.104.05" and api.cuda_version() == "12.2"
    assert api.nvlink_all() is False
    assert fake_from_spec("1xA100-80GB+1xA100-40GB").nvlink_all() is False   # mixed: not all alike
    consumer = fake_from_spec("2xRTX4090")
    assert consumer.nvlink_all() is False and consumer.p2p_matrix() == [["X", "NS"], ["NS", "X"]]


def test_fake_none_is_unavailable():
    api = fake_from_spec("none")
    assert isinstance(api, UnavailableNvml) and not api.available and "no NVIDIA driver" in api.reason


@pytest.mark.parametrize("spec", ["0xH100", "65xH100", "8xNOPE", "H100", "8xH100,colour=red", "8xH100,seed=x",
                                  "8xH100,nvlink=maybe", "40xH100+40xA100", "/nonexistent/fake.json"])
def test_fake_bad_specs_name_the_variable(spec):
    with pytest.raises(InputError) as err:
        fake_from_spec(spec)
    assert err.value.field == FAKE_ENV and "\n" not in str(err.value)


def _write(tmp_path, doc):
    path = tmp_path / "fake.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_fake_json_with_failing_metrics_and_processes(tmp_path, monkeypatch):
    doc = {"driver_version": "560.35.03", "cuda_version": "12.6", "frozen": True,
           "devices": [{"gpu": "H100-80GB", "fail": ["power_w", "temp_c", "uuid"],
                        "processes": [{"pid": 4242, "used_memory": "10GB"}, {"pid": 7, "used_memory": None}]},
                       {"name": "NVIDIA Custom", "memory_total": "12GB", "compute_capability": [7, 5],
                        "util": 33, "mem_used": 1024, "power_w": 50.5, "power_limit_w": 75}]}
    monkeypatch.setenv(FAKE_ENV, _write(tmp_path, doc))
    api = open_nvml()
    d0, d1 = api.devices()
    assert d0.uuid is None and d0.name == "NVIDIA H100 80GB HBM3"
    assert d1.memory_total == 12 * GiB and d1.compute_capability == (7, 5)
    s0, s1 = api.sample()
    assert s0.power_w is None and s0.temp_c is None and s0.util is not None
    assert [(p.pid, p.used_memory) for p in s0.processes] == [(4242, 10 * GiB), (7, None)]
    assert (s1.util, s1.mem_used, s1.power_w, s1.power_limit_w) == (33, 1024, 50.5, 75.0)
    assert api.sample() == [s0, s1]
    assert api.driver_version() == "560.35.03"


def test_fake_json_p2p_matrix_and_unavailable(tmp_path):
    doc = {"devices": [{"gpu": "A40"}, {"gpu": "A40"}, {"gpu": "A40"}],
           "p2p": [["X", "OK", "NS"], ["OK", "X", "NS"], ["NS", "NS", "X"]], "nvlink": False}
    api = fake_from_spec(_write(tmp_path, doc))
    assert api.p2p_matrix([2, 0]) == [["X", "NS"], ["NS", "X"]]
    assert api.nvlink_all() is False
    gone = fake_from_spec(_write(tmp_path, {"unavailable": "Driver Not Loaded"}))
    assert not gone.available and gone.reason == "Driver Not Loaded"


@pytest.mark.parametrize("doc", [[], {"devices": "8"}, {"devices": [{"name": "x"}]},
                                 {"devices": [{"gpu": "H100", "fail": ["fan"]}]},
                                 {"devices": [{"gpu": "H100"}], "p2p": [["X"], ["OK"]]},
                                 {"devices": [{"gpu": "H100", "mem_used": "lots"}]}])
def test_fake_json_errors(tmp_path, doc):
    with pytest.raises(InputError) as err:
        fake_from_spec(_write(tmp_path, doc))
    assert err.value.field == FAKE_ENV


def test_fake_json_not_json(tmp_path):
    path = tmp_path / "fake.json"
    path.write_text("{nope")
    with pytest.raises(InputError):
        fake_from_spec(str(path))


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES

def _devs(n=4):
    return [GpuStatic(i, "NVIDIA A100-SXM4-80GB", 80 * GiB, uuid=f"GPU-{i}{i}{i}{i}abcd-0000") for i in range(n)]


def test_visible_devices_unset_means_all():
    devs = _devs()
    assert visible_devices(devs, None) == (devs, None)


def test_visible_devices_indices_in_the_given_order():
    devs = _devs()
    got, note = visible_devices(devs, "3, 1")
    assert [d.index for d in got] == [3, 1] and note is None


def test_visible_devices_by_uuid_prefix():
    devs = _devs()
    got, note = visible_devices(devs, "GPU-2222,GPU-0000abcd-0000")
    assert [d.index for d in got] == [2, 0] and note is None


def test_visible_devices_empty_hides_everything():
    got, note = visible_devices(_devs(), "")
    assert got == [] and "hides all 4 GPUs" in note


@pytest.mark.parametrize("value, kept, words", [
    ("0,7,1", [0], "out of range"),
    ("1,1", [1], "repeats"),
    ("-1", [], "neither"),
    ("2,MIG-abc", [2], "MIG"),
    ("GPU-", [], "neither"),
    ("GPU-9", [], "matches no"),
])
def test_visible_devices_stop_at_the_first_bad_entry(value, kept, words):
    got, note = visible_devices(_devs(), value)
    assert [d.index for d in got] == kept
    assert words in note and value in note


def test_visible_devices_ambiguous_uuid_prefix():
    devs = [GpuStatic(0, "x", 1, uuid="GPU-abc1"), GpuStatic(1, "x", 1, uuid="GPU-abc2")]
    got, note = visible_devices(devs, "GPU-abc")
    assert got == [] and "more than one" in note


def _memory_info(total, used_v2, reserved, v2_supported=True):
    """nvidia-ml-py's nvmlDeviceGetMemoryInfo(handle, version=None): v1's "used" counts the driver's reserve,
    v2 (version=nvmlMemory_v2) reports it apart and its "used" is nvidia-smi's."""
    def info(handle, version=None):
        if version is None:
            return SimpleNamespace(total=total, used=used_v2 + reserved, free=total - used_v2 - reserved)
        if not v2_supported:
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return SimpleNamespace(version=version, total=total, reserved=reserved, used=used_v2,
                               free=total - used_v2 - reserved)
    return info


def test_memory_used_is_what_nvidia_smi_shows(monkeypatch):
    """shared/gpu/2026-12-04: on an idle H200 NVML's v1 "used" read 644939776 B (615 MiB) where nvidia-smi showed
    0 MiB: the driver's reserve. The sampler reads v2, whose "used" leaves it out, and reports the reserve apart."""
    FakeDriver(monkeypatch)
    reserve = 644939776
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", _memory_info(150754820096, 0, reserve))
    s = RealNvml().sample()[0]
    assert s.mem_used == 0 and s.mem_reserved == reserve and s.mem_total == 150754820096


def test_an_older_driver_without_v2_memory_info_reads_v1_and_says_so(monkeypatch):
    FakeDriver(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", _memory_info(80 * GiB, 2 * GiB, GiB // 2,
                                                                         v2_supported=False))
    s = RealNvml().sample()[0]
    assert s.mem_used == 2 * GiB + GiB // 2 and s.mem_reserved is None    # v1: the reserve is inside "used"
