"""The one small interface to NVIDIA's NVML, shared by the probe and the launch sampler.

Like nvitop's api layer: nothing here raises for one missing metric; it reports None (shown as
N/A). `open_nvml()` returns the real binding (nvidia-ml-py's `pynvml`), an unavailable API with
the reason when there is no driver, or, when WIZARD_FAKE_NVML is set, the fake of
wizard/probe/fake_nvml.py (tests and demos): a catalogue spec such as "8xH100-80GB" or a JSON file.

Indices: `GpuStatic.index` and `GpuSample.index` are NVML's indices (PCI bus order, what
nvidia-smi shows). What CUDA calls device 0 depends on CUDA_VISIBLE_DEVICES; `visible_devices`
does that mapping.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

from wizard.probe.nvml_api import (  # noqa: F401 - the interface, importable from here as ever
    FAKE_ENV,
    SAMPLE_METRICS,
    STATIC_METRICS,
    GpuHealth,
    GpuProcess,
    GpuSample,
    GpuStatic,
    NoXids,
    NvmlApi,
    UnavailableNvml,
    XidWatch,
    clock_event_names,
    parse_gpu_groups,
    parse_yes_no,
)

def open_nvml() -> NvmlApi:
    """The fake when WIZARD_FAKE_NVML is set (non-empty), else the real NVML or why it is unavailable.

    Raises InputError (field WIZARD_FAKE_NVML) only for a malformed fake spec or file.
    """
    spec = os.environ.get(FAKE_ENV, "").strip()
    if spec:
        from wizard.probe.fake_nvml import fake_from_spec  # only when asked for: the product runs on the real one
        return fake_from_spec(spec)
    return RealNvml()


# --------------------------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES


def visible_devices(devices: list[GpuStatic], value: str | None) -> tuple[list[GpuStatic], str | None]:
    """The devices CUDA would expose for CUDA_VISIBLE_DEVICES=`value`, in CUDA's order, and a note.

    Follows CUDA's rules: entries are indices or (prefixes of) UUIDs, separated by commas;
    parsing stops at the first entry that is invalid, out of range or repeated, and the devices
    before it stay visible. Unset (None) means every device. The note (None when nothing
    unusual happened) says what was dropped, so the probe can tell the user.
    Indices are taken in NVML's order, which is CUDA's when CUDA_DEVICE_ORDER=PCI_BUS_ID and,
    for identical GPUs, also under CUDA's default fastest-first order.
    """
    if value is None:
        return list(devices), None
    entries = [e.strip() for e in value.split(",")]
    if entries == [""]:
        return [], f"CUDA_VISIBLE_DEVICES is empty: it hides all {len(devices)} GPUs"
    chosen: list[GpuStatic] = []
    for entry in entries:
        device, problem = _match_visible_entry(devices, entry)
        if device is not None and device in chosen:
            problem = f"{entry!r} repeats a device"
        if problem:
            kept = f"; CUDA sees only the {len(chosen)} before it" if chosen else "; CUDA sees no GPU"
            return chosen, f"CUDA_VISIBLE_DEVICES={value!r}: {problem}{kept}"
        chosen.append(device)
    return chosen, None


def _match_visible_entry(devices: list[GpuStatic], entry: str) -> tuple[GpuStatic | None, str | None]:
    if re.fullmatch(r"\d+", entry):
        i = int(entry)
        if i >= len(devices):
            return None, f"index {i} is out of range ({len(devices)} GPUs)"
        return devices[i], None
    if entry.upper().startswith("MIG-"):
        return None, f"{entry!r} is a MIG instance, which the wizard does not plan for"
    if entry.upper().startswith("GPU-") and len(entry) > 4:
        hits = [d for d in devices if d.uuid and d.uuid.upper().startswith(entry.upper())]
        if len(hits) == 1:
            return hits[0], None
        return None, f"{entry!r} matches {'no' if not hits else 'more than one'} GPU UUID"
    return None, f"{entry!r} is neither a GPU index nor a GPU UUID"


# --------------------------------------------------------------------------------------------
# The real NVML

_P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "NS", 5: "NS", 6: "U"}  # nvidia-smi topo -p2p legend

_INIT_HINTS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver on this machine",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_LibRmVersionMismatch": "the driver was upgraded without reloading its kernel module (reboot)",
    "NVMLError_NoPermission": "no permission to open the NVIDIA devices",
    "NVMLError_FunctionNotFound": "the NVIDIA driver is older than the nvidia-ml-py binding",
}

# pynvml keeps process-wide state (the library handle, a refcount): one lock for every call.
_PYNVML_LOCK = threading.RLock()


def init_failure_reason(exc: BaseException) -> str:
    """One line for a failed nvmlInit: NVML's own words plus what they mean here."""
    text = str(exc).strip() or type(exc).__name__
    hint = _INIT_HINTS.get(type(exc).__name__)
    return f"{text}: {hint}" if hint else text


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _cuda_version_text(code: int | None) -> str | None:
    """NVML's 12040 -> '12.4' (major*1000 + minor*10)."""
    if not isinstance(code, int) or code <= 0:
        return None
    return f"{code // 1000}.{(code % 1000) // 10}"


class RealNvml:
    """nvidia-ml-py's pynvml, every call under one lock, every metric failure turned into None."""

    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._static: list[GpuStatic] | None = None
        self._closed = False
        try:
            import pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py): no GPU information"
            return
        if not hasattr(pynvml, "nvmlInitWithFlags"):
            # The deprecated `pynvml` package (<= 11.x) shipped its own module over NVIDIA's.
            self.reason = ("the installed pynvml module is not nvidia-ml-py's (clobbered install): "
                           "pip uninstall -y pynvml && pip install --force-reinstall nvidia-ml-py")
            return
        self._nvml = pynvml
        with _PYNVML_LOCK:
            try:
                pynvml.nvmlInit()
            # Every init failure, a missing libnvidia-ml.so included, is an NVMLError; OSError is the
            # ctypes load error that older bindings let through.
            except (pynvml.NVMLError, OSError) as exc:
                self.reason = init_failure_reason(exc)
                self._nvml = None
                return
            try:
                count = pynvml.nvmlDeviceGetCount()
                self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            except pynvml.NVMLError as exc:
                self.reason = f"NVML could not list the GPUs: {init_failure_reason(exc)}"
                self._shutdown()
                return
        self.available = True

    # -- plumbing ------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args), or None when NVML can't answer (NotSupported, lost GPU, ...)."""
        if self._nvml is None:
            return None
        fn = getattr(self._nvml, name, None)
        if fn is None:
            return None
        try:
            with _PYNVML_LOCK:
                return fn(*args)
        # Broad on purpose (nvitop's rule: a metric that fails reads as N/A, never a crash): beside
        # NVMLError the wrappers raise ctypes.ArgumentError, UnicodeDecodeError, ... by binding and driver version.
        except Exception:
            return None

    def _first(self, *calls: tuple[Any, ...]) -> Any:
        """The first of several (name, *args) calls that answers: newer API first, older next."""
        for name, *args in calls:
            value = self._call(name, *args)
            if value is not None:
                return value
        return None

    def _shutdown(self) -> None:
        if self._nvml is not None:
            try:
                with _PYNVML_LOCK:
                    self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:   # the driver went away first: nothing left to shut down
                pass
        self._nvml = None

    # -- system --------------------------------------------------------------------------

    def driver_version(self) -> str | None:
        value = self._call("nvmlSystemGetDriverVersion")
        return _text(value) if value is not None else None

    def cuda_version(self) -> str | None:
        return _cuda_version_text(self._first(("nvmlSystemGetCudaDriverVersion",),
                                              ("nvmlSystemGetCudaDriverVersion_v2",)))

    # -- devices -------------------------------------------------------------------------

    def devices(self) -> list[GpuStatic]:
        if self._static is None and self.available:
            self._static = [self._device_static(i, h) for i, h in enumerate(self._handles)]
        return list(self._static or [])

    def _device_static(self, index: int, handle: Any) -> GpuStatic:
        name = self._call("nvmlDeviceGetName", handle)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        uuid = self._call("nvmlDeviceGetUUID", handle)
        pci = self._first(("nvmlDeviceGetPciInfo", handle), ("nvmlDeviceGetPciInfo_v2", handle))
        cc = self._call("nvmlDeviceGetCudaComputeCapability", handle)
        return GpuStatic(
            index=index,
            name=_text(name) if name is not None else f"GPU {index}",
            memory_total=int(getattr(memory, "total", 0) or 0),
            uuid=_text(uuid) if uuid is not None else None,
            pci_bus_id=(_text(getattr(pci, "busId", "")) or None) if pci is not None else None,
            compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
        )

    def _pick(self, indices: list[int] | None) -> list[tuple[int, Any]]:
        chosen = range(len(self._handles)) if indices is None else indices
        return [(i, self._handles[i]) for i in chosen if 0 <= i < len(self._handles)]

    def _const(self, name: str, default: int) -> int:
        """A pynvml constant (nvidia-ml-py 13.x defines some as one-element tuples: NVML_P2P_CAPS_INDEX_READ = 0,)."""
        value = getattr(self._nvml, name, default) if self._nvml is not None else default
        return int(value[0] if isinstance(value, tuple) else value)

    def p2p_matrix(self, indices: list[int] | None = None) -> list[list[str]] | None:
        picked = self._pick(indices)
        if not picked:
            return None
        cap = self._const("NVML_P2P_CAPS_INDEX_READ", 0)
        matrix: list[list[str]] = []
        answered = False
        for i, hi in picked:
            row = []
            for j, hj in picked:
                if i == j:
                    row.append("X")
                    continue
                status = self._call("nvmlDeviceGetP2PStatus", hi, hj, cap)
                answered = answered or status is not None
                row.append(_P2P_CODES.get(status, "U") if status is not None else "U")
            matrix.append(row)
        return matrix if answered or len(picked) == 1 else None

    def nvlink_all(self, indices: list[int] | None = None) -> bool | None:
        picked = self._pick(indices)
        if len(picked) < 2:
            return None
        # The direct question first: can each pair do P2P over NVLink?
        cap = self._const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
        pairs = [(hi, hj) for a, (_, hi) in enumerate(picked) for (_, hj) in picked[a + 1:]]
        answers = [self._call("nvmlDeviceGetP2PStatus", hi, hj, cap) for hi, hj in pairs]
        if all(a is not None for a in answers):
            return all(a == 0 for a in answers)
        # Older drivers: every GPU having an active link is what NVSwitch boxes look like.
        actives = [self._active_nvlinks(h) for _, h in picked]
        if any(a == 0 for a in actives):
            return False
        if all(a is not None and a > 0 for a in actives):
            return True
        return None

    def _active_nvlinks(self, handle: Any) -> int | None:
        """Active NVLink count, 0 when none, None when NVML can't say (no NVLink support at all)."""
        max_links = int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18) or 18)
        states = [self._call("nvmlDeviceGetNvLinkState", handle, link) for link in range(max_links)]
        known = [s for s in states if s is not None]
        if not known:
            return None
        return sum(1 for s in known if s)

    # -- samples -------------------------------------------------------------------------

    def sample(self) -> list[GpuSample]:
        if not self.available:
            return []
        out = []
        for i, handle in enumerate(self._handles):
            try:
                out.append(self._sample_one(i, handle))
            except (TypeError, ValueError):  # `_call` swallows NVML's errors; this is an odd answer (int(pid))
                out.append(GpuSample(index=i))
        return out

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        util = self._call("nvmlDeviceGetUtilizationRates", handle)
        # NVML's v2 memory info reports the driver's reserve apart: its "used" is nvidia-smi's. v1's "used" counts
        # the reserve too (615 MiB on an idle H200 where nvidia-smi shows 0); older drivers answer v1 only.
        v2 = getattr(self._nvml, "nvmlMemory_v2", None)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle, v2) if v2 is not None else None
        reserved = _int_or_none(getattr(memory, "reserved", None)) if memory is not None else None
        if memory is None:
            memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        power = self._call("nvmlDeviceGetPowerUsage", handle)
        limit = self._first(("nvmlDeviceGetEnforcedPowerLimit", handle),
                            ("nvmlDeviceGetPowerManagementLimit", handle))
        sensor = getattr(self._nvml, "NVML_TEMPERATURE_GPU", 0)
        # GetTemperature is deprecated (removed with CUDA 14); older drivers lack the V form.
        temp = self._first(("nvmlDeviceGetTemperatureV", handle, sensor), ("nvmlDeviceGetTemperature", handle, sensor))
        clock = self._call("nvmlDeviceGetClockInfo", handle, getattr(self._nvml, "NVML_CLOCK_SM", 1))
        procs = self._first(("nvmlDeviceGetComputeRunningProcesses", handle),
                            ("nvmlDeviceGetComputeRunningProcesses_v2", handle))
        return GpuSample(
            index=index,
            util=_int_or_none(getattr(util, "gpu", None)),
            mem_used=_int_or_none(getattr(memory, "used", None)),
            mem_total=_int_or_none(getattr(memory, "total", None)),
            mem_reserved=reserved,
            power_w=power / 1000.0 if isinstance(power, (int, float)) else None,      # mW -> W
            power_limit_w=limit / 1000.0 if isinstance(limit, (int, float)) else None,
            temp_c=_int_or_none(temp),
            sm_clock_mhz=_int_or_none(clock),
            processes=[GpuProcess(pid=int(p.pid), used_memory=_int_or_none(getattr(p, "usedGpuMemory", None)))
                       for p in (procs or []) if getattr(p, "pid", None) is not None],
        )

    # -- health --------------------------------------------------------------------------

    def health(self) -> list[GpuHealth]:
        if not self.available:
            return []
        return [self._health_one(i, h) for i, h in enumerate(self._handles)]

    def _health_one(self, index: int, handle: Any) -> GpuHealth:
        unc = self._const("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        cor = self._const("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        volatile, aggregate = self._const("NVML_VOLATILE_ECC", 0), self._const("NVML_AGGREGATE_ECC", 1)
        mode = self._call("nvmlDeviceGetEccMode", handle)            # [current, pending]
        ecc_on = bool(mode[0]) if isinstance(mode, (list, tuple)) and mode else None
        retired = None
        for cause in ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
                      "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"):
            pages = self._call("nvmlDeviceGetRetiredPages", handle, self._const(cause, 0 if "DOUBLE" in cause else 1))
            if pages is not None:
                retired = (retired or 0) + len(pages)
        pending = self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        rows = self._call("nvmlDeviceGetRemappedRows", handle)      # (correctable, uncorrectable, pending, failed)
        rows = tuple(rows) if isinstance(rows, (list, tuple)) and len(rows) == 4 else (None,) * 4
        reasons = self._first(("nvmlDeviceGetCurrentClocksEventReasons", handle),
                              ("nvmlDeviceGetCurrentClocksThrottleReasons", handle))
        return GpuHealth(
            index=index, ecc_enabled=ecc_on,
            ecc_uncorrected_volatile=_int_or_none(self._call("nvmlDeviceGetTotalEccErrors", handle, unc, volatile)),
            ecc_uncorrected_aggregate=_int_or_none(self._call("nvmlDeviceGetTotalEccErrors", handle, unc, aggregate)),
            ecc_corrected_volatile=_int_or_none(self._call("nvmlDeviceGetTotalEccErrors", handle, cor, volatile)),
            retired_pages=retired, retired_pending=_flag(pending),
            remapped_correctable=_int_or_none(rows[0]), remapped_uncorrectable=_int_or_none(rows[1]),
            remap_pending=_flag(rows[2]), remap_failed=_flag(rows[3]),
            clock_events=clock_event_names(int(reasons)) if isinstance(reasons, int) else None)

    def xid_watch(self) -> XidWatch:
        """NVML's critical-error (XID) events of every GPU from now on; NoXids where NVML cannot register them."""
        if not self.available:
            return NoXids()
        event_set = self._call("nvmlEventSetCreate")
        kind = self._const("nvmlEventTypeXidCriticalError", 8)
        if event_set is None:
            return NoXids()
        registered = [i for i, h in enumerate(self._handles)
                      if self._call_or_error("nvmlDeviceRegisterEvents", h, kind, event_set) is None]
        if not registered:
            self._call("nvmlEventSetFree", event_set)
            return NoXids()
        return _RealXidWatch(self, event_set)

    def _call_or_error(self, name: str, *args: Any) -> BaseException | None:
        """pynvml.<name>(*args) for a call that answers nothing: None when it worked, else the error."""
        fn = getattr(self._nvml, name, None) if self._nvml is not None else None
        if fn is None:
            return AttributeError(name)
        try:
            with _PYNVML_LOCK:
                fn(*args)
        except Exception as exc:        # NotSupported on a GPU without events: that GPU is not watched
            return exc
        return None

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._shutdown()
            self.available = False


class _RealXidWatch:
    def __init__(self, nvml: RealNvml, event_set: Any) -> None:
        self.nvml = nvml
        self.event_set = event_set

    def poll(self) -> list[tuple[int, int]]:
        """Every XID event waiting in the set (a wait of 0 ms each: nothing blocks)."""
        out: list[tuple[int, int]] = []
        for _ in range(1000):
            data = self.nvml._call("nvmlEventSetWait_v2", self.event_set, 0)
            if data is None:            # NVML_ERROR_TIMEOUT: no more events
                break
            index = _int_or_none(self.nvml._call("nvmlDeviceGetIndex", getattr(data, "device", None)))
            out.append((index if index is not None else -1, int(getattr(data, "eventData", 0) or 0)))
        return out

    def close(self) -> None:
        self.nvml._call("nvmlEventSetFree", self.event_set)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _flag(value: Any) -> bool | None:
    return bool(value) if isinstance(value, int) else None


__all__ = ["FAKE_ENV", "GpuHealth", "GpuProcess", "GpuSample", "GpuStatic", "NvmlApi", "RealNvml", "UnavailableNvml",
           "init_failure_reason", "open_nvml", "parse_gpu_groups", "parse_yes_no", "visible_devices"]
