"""`wizard env`: what to paste into a bug report (like `accelerate env` and `ds_report`), and the one-line note
the CLI prints when a library the results depend on is outside the tested range (wizard/versions.py).

Cheap on purpose (under a second, no torch): versions come from package metadata and the GPUs from the probe's
NVML interface (wizard/probe/nvml.py, the fake under WIZARD_FAKE_NVML), which imports only nvidia-ml-py.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TextIO

from wizard import __version__, versions

# What a status reads as in the text report: a reader scanning a pasted report sees the odd ones at once.
MARKS = {versions.IN_RANGE: "in range", versions.OLDER: "OLDER than tested", versions.NEWER: "NEWER than tested",
         versions.MISSING: "MISSING", versions.UNREADABLE: "UNREADABLE version"}
OPTIONAL_MISSING = "not installed (optional)"


@dataclass
class EnvGpu:
    index: int                            # NVML's (nvidia-smi's) index
    name: str
    memory_total: int                     # bytes
    compute_capability: list[int] | None


@dataclass
class EnvReport:
    wizard: str
    python: str
    python_executable: str
    platform: str
    libraries: dict[str, dict[str, Any]]  # name -> installed, tested [oldest, newest], status, optional
    driver_version: str | None
    cuda_version: str | None              # the CUDA version the driver supports
    gpus: list[EnvGpu] = field(default_factory=list)
    gpu_reason: str | None = None         # why there are no GPUs
    env: dict[str, str] = field(default_factory=dict)   # CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, SLURM_*

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def library_table(found: list[versions.Installed]) -> dict[str, dict[str, Any]]:
    return {i.entry.name: {"installed": i.version, "tested": [i.entry.oldest, i.entry.newest], "status": i.status,
                           "optional": i.entry.optional} for i in found}


def gpu_section(open_api: Callable[[], Any] | None = None) -> tuple[str | None, str | None, list[EnvGpu], str | None]:
    """(driver, CUDA, GPUs, why none) from the probe's NVML interface; no GPU or no driver is an answer."""
    from wizard.errors import InputError
    from wizard.probe.nvml import open_nvml

    try:
        api = (open_api or open_nvml)()
    except InputError:
        raise                             # a malformed WIZARD_FAKE_NVML is a usage error, as in `wizard probe`
    except Exception as exc:              # an NVML surprise must not cost the user the rest of the report
        return None, None, [], f"GPU probe failed: {type(exc).__name__}: {exc}"
    try:
        if not api.available:
            return None, None, [], api.reason or "NVML is not available"
        gpus = [EnvGpu(d.index, d.name, d.memory_total, list(d.compute_capability) if d.compute_capability else None)
                for d in api.devices()]
        return api.driver_version(), api.cuda_version(), gpus, None if gpus else "NVML works but reports no GPU"
    except Exception as exc:
        return None, None, [], f"GPU probe failed: {type(exc).__name__}: {exc}"
    finally:
        api.close()


def collect(lookup: Callable[[str], str | None] | None = None) -> EnvReport:
    from wizard.probe.hardware import relevant_env

    driver, cuda, gpus, reason = gpu_section()
    return EnvReport(wizard=__version__, python=platform.python_version(), python_executable=sys.executable,
                     platform=platform.platform(), libraries=library_table(versions.survey(lookup)),
                     driver_version=driver, cuda_version=cuda, gpus=gpus, gpu_reason=reason, env=relevant_env())


def _mark(lib: dict[str, Any]) -> str:
    if lib["status"] == versions.MISSING and lib["optional"]:
        return OPTIONAL_MISSING
    return MARKS[lib["status"]]


def text_lines(report: EnvReport) -> list[str]:
    from wizard.units import fmt_bytes

    lines = ["Copy and paste this into your bug report:", "",
             f"- wizard version: {report.wizard}",
             f"- Python: {report.python} ({report.python_executable})",
             f"- Platform: {report.platform}",
             "- Libraries (installed, tested range, status):"]
    rows = [(name, lib["installed"] or "-", versions.range_text(*lib["tested"]), _mark(lib))
            for name, lib in report.libraries.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[3])
    if report.gpus:
        lines.append(f"- NVIDIA driver: {report.driver_version or 'unknown'}, CUDA (driver): "
                     f"{report.cuda_version or 'unknown'}")
        for g in report.gpus:
            cc = f"cc {g.compute_capability[0]}.{g.compute_capability[1]}" if g.compute_capability else "cc ?"
            lines.append(f"    GPU {g.index}: {g.name}, {fmt_bytes(g.memory_total)}, {cc}")
    else:
        lines.append(f"- GPUs: none ({report.gpu_reason or 'none found'})")
    for key, value in report.env.items():
        lines.append(f"- {key}: {value}")
    return lines


# ----------------------------------------------------------------------------- the command


def build_parser(parser_class: type[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = parser_class(prog="wizard env", description=(
        "What to paste into a bug report: the wizard's version, Python, the platform, each library's installed "
        "version beside the range the wizard is tested with, and the GPUs with driver and CUDA versions (NVML). "
        "Imports no torch."))
    p.add_argument("--json", action="store_true", default=False, help="print the same as one JSON object")
    p.set_defaults(func=cmd_env)
    return p


def cmd_env(ns: argparse.Namespace) -> int:
    report = collect()
    if ns.json:
        print(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        print("\n".join(text_lines(report)))
    return 0


# ----------------------------------------------------------------------------- the out-of-range note

_noted: list[bool] = []                   # non-empty once this run has said it: one note per run


def forget_note() -> None:
    """A new run (cli.main called again in-process) may say it again."""
    _noted.clear()


def note_untested_versions(file: TextIO | None = None,
                           lookup: Callable[[str], str | None] | None = None) -> str | None:
    """Print the out-of-range note to stderr, at most once per run; the line printed, or None."""
    if _noted:
        return None
    _noted.append(True)
    line = versions.out_of_range_note(versions.survey(lookup))
    if line:
        print(line, file=file or sys.stderr)
    return line
