"""The GPUs `--assume` and the fake NVML know: memory, compute capability, NVLink, names.

Memory is what NVML (and so nvidia-smi, and the planner on a real machine) reports as the
device's total, not the marketing figure: an "80GB" H100 reports 81559 MiB, an "80GB" A100
81920 MiB, a "24GB" RTX 4090 24564 MiB. The figures come from public nvidia-smi outputs of
each part with its default ECC setting; a driver or an ECC toggle moves them by a few
hundred MiB, which the planner's headroom absorbs.

Lookup (`lookup(text)`) accepts the canonical name ("H100-80GB"), the model alone ("h100",
"RTX4090", "4090"), NVML's own names ("NVIDIA A100-SXM4-40GB") and form-factor words
("H100-PCIe-80GB", "A100-SXM4-80GB"), case-insensitive, with or without "-", "_" or spaces.
When a model comes in several memory sizes and none is given, the most common size is
taken and the choice is said in the returned note (e.g. "V100" -> V100-32GB). When several
form factors share a model and memory (A100-80GB SXM and PCIe), the first in `CATALOGUE`
wins: the SXM board, which is what 4- and 8-GPU training servers carry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from wizard.errors import InputError
from wizard.units import MiB


@dataclass(frozen=True)
class GpuSpec:
    name: str                          # canonical: "H100-80GB", "RTX4090-24GB"
    nvml_name: str                     # what NVML reports: "NVIDIA H100 80GB HBM3"
    memory: int                        # bytes, NVML's total (see module doc)
    compute_capability: tuple[int, int]
    nvlink: bool                       # a multi-GPU server of this part joins every pair by NVLink
    keys: tuple[str, ...]              # normalised model names that mean this part
    mem_tags: tuple[int, ...]          # the "NN GB" figures people write for it
    power_limit_w: int = 300           # default board power limit (the fake NVML's limit)
    kind: str = "datacenter"           # "datacenter" | "workstation" | "consumer"

    @property
    def bf16(self) -> bool:
        return self.compute_capability >= (8, 0)

    @property
    def consumer(self) -> bool:
        return self.kind == "consumer"


def _mib(n: int) -> int:
    return n * MiB


# Order matters: for a model + memory shared by several entries the first one wins, and
# `_MOST_COMMON` picks the size when none is given.
CATALOGUE: tuple[GpuSpec, ...] = (
    # Blackwell / Hopper
    GpuSpec("B200-180GB", "NVIDIA B200", _mib(183359), (10, 0), True, ("B200", "B200SXM"), (180, 192), 1000),
    GpuSpec("GH200-96GB", "NVIDIA GH200 480GB", _mib(97871), (9, 0), True, ("GH200",), (96, 480), 900),
    GpuSpec("H200-141GB", "NVIDIA H200", _mib(143771), (9, 0), True, ("H200", "H200SXM"), (141, 140), 700),
    GpuSpec("H100-80GB", "NVIDIA H100 80GB HBM3", _mib(81559), (9, 0), True,
            ("H100", "H100SXM", "H100SXM5"), (80,), 700),
    GpuSpec("H100-PCIe-80GB", "NVIDIA H100 PCIe", _mib(81559), (9, 0), False, ("H100PCIE",), (80,), 350),
    # H100 NVL: 94 GB nominal, pairs joined by an NVLink bridge, not every pair in a server.
    GpuSpec("H100-NVL-94GB", "NVIDIA H100 NVL", _mib(95830), (9, 0), False, ("H100NVL", "H100"), (94, 96), 400),
    GpuSpec("H800-80GB", "NVIDIA H800", _mib(81559), (9, 0), True, ("H800", "H800SXM"), (80,), 700),
    # Ampere data centre
    GpuSpec("A100-80GB", "NVIDIA A100-SXM4-80GB", _mib(81920), (8, 0), True,
            ("A100", "A100SXM", "A100SXM4"), (80,), 400),
    GpuSpec("A100-40GB", "NVIDIA A100-SXM4-40GB", _mib(40960), (8, 0), True,
            ("A100", "A100SXM", "A100SXM4"), (40,), 400),
    GpuSpec("A100-PCIe-80GB", "NVIDIA A100 80GB PCIe", _mib(81920), (8, 0), False, ("A100PCIE",), (80,), 300),
    GpuSpec("A100-PCIe-40GB", "NVIDIA A100-PCIE-40GB", _mib(40960), (8, 0), False, ("A100PCIE",), (40,), 250),
    GpuSpec("A800-80GB", "NVIDIA A800-SXM4-80GB", _mib(81920), (8, 0), True, ("A800", "A800SXM", "A800SXM4"), (80,), 400),
    GpuSpec("A40-48GB", "NVIDIA A40", _mib(46068), (8, 6), False, ("A40",), (48,), 300),
    GpuSpec("A30-24GB", "NVIDIA A30", _mib(24576), (8, 0), False, ("A30",), (24,), 165),
    GpuSpec("A10-24GB", "NVIDIA A10", _mib(23028), (8, 6), False, ("A10",), (24,), 150),
    GpuSpec("A10G-24GB", "NVIDIA A10G", _mib(23028), (8, 6), False, ("A10G",), (24,), 300),
    # Ada data centre
    GpuSpec("L40S-48GB", "NVIDIA L40S", _mib(46068), (8, 9), False, ("L40S",), (48,), 350),
    GpuSpec("L40-48GB", "NVIDIA L40", _mib(46068), (8, 9), False, ("L40",), (48,), 300),
    GpuSpec("L4-24GB", "NVIDIA L4", _mib(23034), (8, 9), False, ("L4",), (24,), 72),
    # Volta / Turing (no bf16)
    GpuSpec("V100-32GB", "Tesla V100-SXM2-32GB", _mib(32768), (7, 0), True,
            ("V100", "V100SXM2", "V100SXM"), (32,), 300),
    GpuSpec("V100-16GB", "Tesla V100-SXM2-16GB", _mib(16384), (7, 0), True,
            ("V100", "V100SXM2", "V100SXM"), (16,), 300),
    GpuSpec("T4-16GB", "Tesla T4", _mib(15360), (7, 5), False, ("T4",), (16, 15), 70),
    # Workstation
    GpuSpec("RTX6000Ada-48GB", "NVIDIA RTX 6000 Ada Generation", _mib(49140), (8, 9), False,
            ("RTX6000ADA", "RTX6000ADAGENERATION", "6000ADA"), (48,), 300, "workstation"),
    GpuSpec("RTXA6000-48GB", "NVIDIA RTX A6000", _mib(49140), (8, 6), False, ("RTXA6000", "A6000"), (48,), 300,
            "workstation"),
    GpuSpec("RTXA5000-24GB", "NVIDIA RTX A5000", _mib(24564), (8, 6), False, ("RTXA5000", "A5000"), (24,), 230,
            "workstation"),
    GpuSpec("RTXA4000-16GB", "NVIDIA RTX A4000", _mib(16376), (8, 6), False, ("RTXA4000", "A4000"), (16,), 140,
            "workstation"),
    # GeForce
    GpuSpec("RTX5090-32GB", "NVIDIA GeForce RTX 5090", _mib(32607), (12, 0), False, ("RTX5090", "5090"), (32,), 575,
            "consumer"),
    GpuSpec("RTX4090-24GB", "NVIDIA GeForce RTX 4090", _mib(24564), (8, 9), False, ("RTX4090", "4090"), (24,), 450,
            "consumer"),
    GpuSpec("RTX4080-16GB", "NVIDIA GeForce RTX 4080", _mib(16376), (8, 9), False, ("RTX4080", "4080"), (16,), 320,
            "consumer"),
    GpuSpec("RTX3090Ti-24GB", "NVIDIA GeForce RTX 3090 Ti", _mib(24564), (8, 6), False,
            ("RTX3090TI", "3090TI"), (24,), 450, "consumer"),
    GpuSpec("RTX3090-24GB", "NVIDIA GeForce RTX 3090", _mib(24576), (8, 6), False, ("RTX3090", "3090"), (24,), 350,
            "consumer"),
)

# The size taken when a model is named without one: what clouds and clusters mostly carry.
_MOST_COMMON = {"H100": "H100-80GB", "A100": "A100-80GB", "A100SXM": "A100-80GB", "A100SXM4": "A100-80GB",
                "A100PCIE": "A100-PCIe-80GB", "V100": "V100-32GB", "V100SXM2": "V100-32GB",
                "V100SXM": "V100-32GB"}

# Words that carry no identity: vendor and brand prefixes, memory technology, "Generation".
_NOISE = re.compile(r"NVIDIA|TESLA|GEFORCE|QUADRO|HBM3E|HBM3|HBM2E|HBM2|GDDR6X|GDDR6|GDDR7|GENERATION")
# A memory figure is a separate token: "A100-40GB", "H100 80GB", never the "10G" inside "A10G".
_MEM_TOKEN = re.compile(r"(?:^|[-_\s])(\d+)\s*(?:GB|GIB|G)(?=$|[-_\s])", re.IGNORECASE)


def names() -> list[str]:
    return [spec.name for spec in CATALOGUE]


def by_name(name: str) -> GpuSpec:
    for spec in CATALOGUE:
        if spec.name == name:
            return spec
    raise KeyError(name)


def _split(text: str) -> tuple[str, int | None]:
    """'A100-SXM4-40GB' -> ('A100SXM4', 40); 'rtx 4090' -> ('RTX4090', None)."""
    raw = text.strip()
    mems = _MEM_TOKEN.findall(raw)
    without_mem = _MEM_TOKEN.sub(" ", raw)
    key = re.sub(r"[-_\s]+", "", without_mem.upper())
    key = _NOISE.sub("", key)
    return key, (int(mems[0]) if mems else None)


def resolve(text: str, field: str = "assume") -> tuple[GpuSpec, str | None]:
    """The catalogue entry `text` names, and a note when a memory size had to be chosen.

    Raises InputError(field, ...) naming the allowed names when nothing (or not that memory
    size of the model) is in the catalogue.
    """
    if not isinstance(text, str) or not text.strip():
        raise InputError(field, f"{text!r} is not a GPU name", ", ".join(names()))
    exact = {spec.name.upper(): spec for spec in CATALOGUE}
    if text.strip().upper() in exact:
        return exact[text.strip().upper()], None
    key, mem = _split(text)
    candidates = [spec for spec in CATALOGUE if key in spec.keys]
    if not candidates:
        raise InputError(field, f"unknown GPU {text.strip()!r}", ", ".join(names()))
    if mem is not None:
        sized = [spec for spec in candidates if mem in spec.mem_tags]
        if not sized:
            raise InputError(field, f"no {mem} GB variant of {text.strip()!r} in the catalogue",
                             ", ".join(spec.name for spec in candidates))
        return sized[0], None
    sizes = sorted({spec.mem_tags[0] for spec in candidates})
    if len(sizes) == 1:
        return candidates[0], None
    chosen = by_name(_MOST_COMMON[key]) if key in _MOST_COMMON else candidates[0]
    others = ", ".join(spec.name for spec in candidates if spec is not chosen)
    note = (f"{text.strip()!r} comes in several memory sizes; assumed {chosen.name} "
            f"(say so explicitly for another: {others})")
    return chosen, note


def lookup(text: str, field: str = "assume") -> GpuSpec:
    """`resolve` without the note."""
    return resolve(text, field)[0]


def match_device(nvml_name: str, memory_total: int | None = None) -> GpuSpec | None:
    """The catalogue entry for a device NVML reported, or None (used for hints only)."""
    for spec in CATALOGUE:
        if spec.nvml_name == nvml_name:
            return spec
    try:
        spec, _note = resolve(nvml_name)
    except InputError:
        return None
    if memory_total is not None:
        # NVML's name rarely carries the size ("NVIDIA H100 PCIe"): pick the variant by memory.
        key, _ = _split(nvml_name)
        same_model = [s for s in CATALOGUE if key in s.keys]
        spec = min(same_model, key=lambda s: abs(s.memory - memory_total), default=spec)
    return spec


# --- Performance figures for the speed model -------------------------------------------------
#
# Dense (no structured sparsity) tensor-core peaks from NVIDIA's datasheets and architecture
# whitepapers, in TFLOP/s: `tensor16` is bf16 (fp16 on Volta/Turing) with fp32 accumulation, which
# is what PyTorch's 16-bit matmuls use, and the one convention the speed model's efficiencies were fitted
# with (planning/speed.py); GeForce cards run fp32-accumulate at half their fp16-accumulate rate, so their
# figure is the lower one of the whitepaper ("Peak FP16/BF16 Tensor TFLOPS with FP32 Accumulate"): RTX 5090
# 209.5 (419 with fp16 accumulate), 4090 165.2 (330.3), 4080 97.5 (194.9), 3090 Ti 80 (160), 3090 71 (142).
# Workstation and data-centre parts run both at the full rate. `fp32` is the non-tensor fp32 peak (PyTorch does not use TF32 for matmuls unless asked).
# `hbm` is memory bandwidth in GB/s. `link` is the NCCL bus bandwidth (GB/s, nccl-tests' "busbw") an
# all-reduce reaches between the GPUs of one server joined as `GpuSpec.nvlink` says: measured
# orders of magnitude from public nccl-tests results (8x H100 NVSwitch ~ 360-480, 8x A100 ~ 230,
# 8x V100 hybrid cube-mesh ~ 130); PCIe servers fall back on `pcie_link`. `pcie_gen` decides the
# host link used by offload (per GPU, one x16 link each).
@dataclass(frozen=True)
class GpuPerf:
    tensor16: float                    # TFLOP/s, dense bf16/fp16 with fp32 accumulate
    fp32: float                        # TFLOP/s, dense fp32 without TF32
    hbm: float                         # GB/s
    pcie_gen: int                      # 3, 4, 5
    nvlink_busbw: float | None = None  # GB/s NCCL all-reduce bus bandwidth inside an NVLink/NVSwitch server
    generation: str = "ampere"         # volta | turing | ampere | ada | hopper | blackwell


PERFORMANCE: dict[str, GpuPerf] = {
    "B200-180GB": GpuPerf(2250, 80, 8000, 5, 720, "blackwell"),
    "GH200-96GB": GpuPerf(989, 67, 4000, 5, 360, "hopper"),
    "H200-141GB": GpuPerf(989, 67, 4800, 5, 360, "hopper"),
    "H100-80GB": GpuPerf(989, 67, 3350, 5, 360, "hopper"),
    "H100-PCIe-80GB": GpuPerf(756, 51, 2000, 5, None, "hopper"),
    "H100-NVL-94GB": GpuPerf(835, 60, 3900, 5, None, "hopper"),
    "H800-80GB": GpuPerf(989, 67, 3350, 5, 160, "hopper"),        # NVLink cut to 400 GB/s
    "A100-80GB": GpuPerf(312, 19.5, 2039, 4, 230, "ampere"),
    "A100-40GB": GpuPerf(312, 19.5, 1555, 4, 230, "ampere"),
    "A100-PCIe-80GB": GpuPerf(312, 19.5, 1935, 4, None, "ampere"),
    "A100-PCIe-40GB": GpuPerf(312, 19.5, 1555, 4, None, "ampere"),
    "A800-80GB": GpuPerf(312, 19.5, 2039, 4, 160, "ampere"),       # NVLink cut to 400 GB/s
    "A40-48GB": GpuPerf(149.7, 37.4, 696, 4, None, "ampere"),
    "A30-24GB": GpuPerf(165, 10.3, 933, 4, None, "ampere"),
    "A10-24GB": GpuPerf(125, 31.2, 600, 4, None, "ampere"),
    "A10G-24GB": GpuPerf(70, 31.5, 600, 4, None, "ampere"),       # AWS publishes no datasheet: commonly cited
    "L40S-48GB": GpuPerf(362, 91.6, 864, 4, None, "ada"),
    "L40-48GB": GpuPerf(181, 90.5, 864, 4, None, "ada"),
    "L4-24GB": GpuPerf(121, 30.3, 300, 4, None, "ada"),
    "V100-32GB": GpuPerf(125, 15.7, 900, 3, 130, "volta"),
    "V100-16GB": GpuPerf(125, 15.7, 900, 3, 130, "volta"),
    "T4-16GB": GpuPerf(65, 8.1, 320, 3, None, "turing"),
    "RTX6000Ada-48GB": GpuPerf(364, 91.1, 960, 4, None, "ada"),
    "RTXA6000-48GB": GpuPerf(154.8, 38.7, 768, 4, None, "ampere"),
    "RTXA5000-24GB": GpuPerf(111, 27.8, 768, 4, None, "ampere"),
    "RTXA4000-16GB": GpuPerf(76.7, 19.2, 448, 4, None, "ampere"),
    "RTX5090-32GB": GpuPerf(209.5, 104.8, 1792, 5, None, "blackwell"),
    "RTX4090-24GB": GpuPerf(165.2, 82.6, 1008, 4, None, "ada"),
    "RTX4080-16GB": GpuPerf(97.5, 48.7, 717, 4, None, "ada"),
    # GA102 whitepaper: 3090 Ti 80 / 3090 71 dense FP16/BF16 tensor TFLOPS with FP32 accumulate (160 / 142 with
    # FP16 accumulate). They read 40 / 35.6, the cards' non-tensor FP32 (= dense TF32) figure: half the convention.
    "RTX3090Ti-24GB": GpuPerf(80, 40, 1008, 4, None, "ampere"),
    "RTX3090-24GB": GpuPerf(71, 35.6, 936, 4, None, "ampere"),
}


def performance(spec: GpuSpec) -> GpuPerf:
    return PERFORMANCE[spec.name]


# --- SkyPilot's names ------------------------------------------------------------------------
#
# What SkyPilot calls each part, in its task YAML (`resources.accelerators`) and in the AcceleratorName column of
# its price catalogues (~/.sky/catalogs/<version>/<cloud>/vms.csv). Sources: SkyPilot 0.14.1's canonical list
# (sky/utils/gpu_names.py: 'H100', 'A100-80GB', 'A100' = 40 GB, 'V100' = 16 GB, 'V100-32GB', 'L40S', 'A10G',
# 'RTX6000-Ada', 'A6000', ...) and the names its catalogue fetchers write (sky/catalog/data_fetchers: AWS, GCP,
# Azure and Lambda use the canonical names; RunPod writes 'H100-SXM', 'A100-80GB-SXM', 'H200-SXM', 'RTX4090',
# 'RTX5090', 'RTX3090-Ti', 'RTXA6000', ...). The first name is the one a task asks for; every name counts as an
# offer of the part in a catalogue. SkyPilot's 'H100' is the SXM board on AWS, GCP and Azure and the PCIe card
# on Lambda and RunPod: the PCIe entry shares it (an H100 of either kind runs what a PCIe card's plan needs).
# A part SkyPilot's catalogues do not sell (H800, A800, export parts) has no entry: no task names it.
SKYPILOT_NAMES: dict[str, tuple[str, ...]] = {
    "B200-180GB": ("B200",),
    "GH200-96GB": ("GH200",),
    "H200-141GB": ("H200", "H200-SXM"),
    "H100-80GB": ("H100", "H100-SXM"),
    "H100-PCIe-80GB": ("H100",),
    "H100-NVL-94GB": ("H100-NVL",),
    "A100-80GB": ("A100-80GB", "A100-80GB-SXM"),
    "A100-40GB": ("A100",),
    "A100-PCIe-80GB": ("A100-80GB",),
    "A100-PCIe-40GB": ("A100",),
    "A40-48GB": ("A40",),
    "A30-24GB": ("A30",),
    "A10-24GB": ("A10",),
    "A10G-24GB": ("A10G",),
    "L40S-48GB": ("L40S",),
    "L40-48GB": ("L40",),
    "L4-24GB": ("L4",),
    "V100-32GB": ("V100-32GB", "V100-SXM2-32GB"),
    "V100-16GB": ("V100", "V100-SXM2"),
    "T4-16GB": ("T4",),
    "RTX6000Ada-48GB": ("RTX6000-Ada",),
    "RTXA6000-48GB": ("A6000", "RTXA6000"),
    "RTXA5000-24GB": ("A5000", "RTXA5000"),
    "RTXA4000-16GB": ("A4000", "RTXA4000"),
    "RTX5090-32GB": ("RTX5090",),
    "RTX4090-24GB": ("RTX4090",),
    "RTX4080-16GB": ("RTX4080",),
    "RTX3090Ti-24GB": ("RTX3090-Ti",),
    "RTX3090-24GB": ("RTX3090",),
}


def skypilot_names(spec: GpuSpec) -> tuple[str, ...]:
    """SkyPilot's names for the part (the first is what a task asks for); () when SkyPilot sells none."""
    return SKYPILOT_NAMES.get(spec.name, ())
