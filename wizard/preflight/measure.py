"""What the preflight's collectives measure, as plain arithmetic (no torch): the operations the training sends,
their sizes, nccl-tests' bus bandwidth for each, and a set of timed samples summed up as a median and its spread.
The collective child (collective.py) times and checks; checks.py, outliers.py and the report read the figures.

The operations are what the planned strategies send: all-reduce (DDP's gradients), all-gather and reduce-scatter
(ZeRO-2/3 and FSDP gather the parameters and scatter the gradients), all-to-all (Ulysses sequence parallelism);
and the ring pass (point-to-point between neighbours), which is not one of them but names the node or the link that
is slow (outliers.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
LABELS = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
          "all_to_all": "all-to-all"}
# nccl-tests' bus bandwidth (doc/PERFORMANCE.md): algorithm bandwidth (the op's size / its time) times the share of
# the data each rank's link carries, so that the figure compares with a link's line rate whatever the number of ranks
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
CPU_BYTES = 16 << 20          # gloo over TCP: large enough to be bandwidth-bound rather than latency-bound
GPU_BYTES = 256 << 20         # nccl-tests reach their plateau bus bandwidth from ~128-256 MiB
SIZE_STEPS = (8, 4, 0)        # several sizes, as nccl-tests sweeps them: the largest / 256, / 16 and the largest
MIN_BYTES = 64 << 10
CPU_SAMPLES = 7               # timed samples per size (after a warm-up): the median is the figure, the rest its spread
GPU_SAMPLES = 10
RING_BYTES_SHARE = 4          # the ring pass sends a quarter of the largest size to each neighbour


def sizes(largest: int) -> list[int]:
    """The message sizes timed for each operation, smallest first."""
    return sorted({max(MIN_BYTES, largest >> step) for step in SIZE_STEPS} | {largest})


def busbw_gbps(op: str, nbytes: int, seconds: float, ranks: int) -> float:
    """The bus bandwidth of one `op` of `nbytes` (nccl-tests' size: the all-reduced buffer, the all-gather's
    output, the reduce-scatter's input, what each rank sends in an all-to-all) in Gb/s."""
    if seconds <= 0 or ranks < 2:
        return 0.0
    return nbytes / seconds * BUS_FACTOR[op](ranks) * 8 / 1e9


def link_gbps(nbytes: int, seconds: float) -> float:
    """A point-to-point transfer's rate, Gb/s."""
    return nbytes / seconds * 8 / 1e9 if seconds > 0 else 0.0


@dataclass(frozen=True)
class Spread:
    """A figure measured several times: the median and the range around it."""
    median: float
    low: float
    high: float
    samples: int

    def to_json(self) -> dict[str, float | int]:
        return {"median": self.median, "low": self.low, "high": self.high, "samples": self.samples}

    def text(self, unit: str = "Gb/s") -> str:
        if self.samples < 2:
            return f"{self.median:.2f} {unit}"
        return f"{self.median:.2f} {unit} (median of {self.samples}: {self.low:.2f}-{self.high:.2f})"


def spread(values: list[float]) -> Spread:
    if not values:
        raise ValueError("no sample")
    return Spread(statistics.median(values), min(values), max(values), len(values))


def summary(op: str, nbytes: int, seconds: list[float], ranks: int) -> dict:
    """One operation at one size, from its timed samples: the median time and its bus bandwidth with the spread
    (the slowest sample gives the low end)."""
    bw = spread([busbw_gbps(op, nbytes, s, ranks) for s in seconds])
    return {"bytes": nbytes, "samples": len(seconds), "seconds": statistics.median(seconds),
            "busbw_gbps": bw.median, "low_gbps": bw.low, "high_gbps": bw.high}


def headline(result: dict, scope: str, op: str = "all_reduce") -> dict | None:
    """The figure of `op` at its largest size in one scope of a collective result ({"ops": {op: [by size]}}), or
    None when it was not measured there."""
    s = ((result or {}).get("scopes") or {}).get(scope) or {}
    runs = [r for r in ((s.get("ops") or {}).get(op) or []) if isinstance(r, dict) and r.get("busbw_gbps") is not None]
    return max(runs, key=lambda r: r["bytes"]) if runs else None
