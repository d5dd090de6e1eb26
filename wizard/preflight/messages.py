"""What the preflight's nodes send each other, as schemas (wizard/schema.py): everything that arrives over the
rendezvous socket is checked here before checks.py or run.py reads a field of it, so a peer's malformed message
(another wizard version, a bug, a stranger) is one clean finding naming the field, never a traceback.

The schemas follow what node.py, collective.py and run.py write. A fact that timed out or failed on the node is
{"timeout": S} or {"error": TEXT} in place of its object (node.with_timeout); fields a schema does not name are
ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wizard.preflight import measure
from wizard.schema import (
    INT64_MAX,
    Bad,
    SchemaError,
    build,
    flag,
    integer,
    list_of,
    map_of,
    nullable,
    number,
    one_of,
    record,
    spec,
    text,
)

MAX_RANK = 1 << 16

size = integer(0, INT64_MAX, "a number of bytes")
small = integer(0, 1 << 31, "a count")
rank = integer(0, MAX_RANK, f"a machine rank (0-{MAX_RANK})")
seconds = number(0.0, 1e9, "a number of seconds")


def hexdigest(v: Any) -> str:
    """A nonce or an HMAC, as hex."""
    if not (isinstance(v, str) and 16 <= len(v) <= 128 and all(c in "0123456789abcdef" for c in v)):
        raise Bad("16-128 lowercase hex digits")
    return v


def _text_key(k: Any) -> str:
    return text(k)


# ----------------------------------------------------------------------------- a node's facts (node.py)


@dataclass(frozen=True)
class Outcome:
    """A fact that did not come: it hung past its deadline or raised."""
    timeout: float | None = spec(seconds)
    error: Any = spec(lambda v: list_of(text, "lines")(v) if isinstance(v, list) else text(v))


def fact(cls: type):
    """cls's object, or the Outcome that stands in for it."""
    def check(v: Any) -> Any:
        if isinstance(v, dict) and ("timeout" in v or "error" in v):
            return record(Outcome)(v)
        return record(cls)(v)
    return check


@dataclass(frozen=True)
class Package:
    version: str | None = spec(text)
    path: str | None = spec(text)


@dataclass(frozen=True)
class Versions:
    python: str | None = spec(text)
    executable: str | None = spec(text)
    torch: Package | None = spec(record(Package))
    accelerate: Package | None = spec(record(Package))
    deepspeed: Package | None = spec(record(Package))
    transformers: Package | None = spec(record(Package))
    peft: Package | None = spec(record(Package))
    torch_cuda: str | None = spec(text)
    nccl: str | None = spec(text)


@dataclass(frozen=True)
class Gpu:
    index: int = spec(small, required=True)
    name: str = spec(text, required=True)
    memory_total: int = spec(size, required=True)
    memory_free: int | None = spec(size)
    pci_bus_id: str | None = spec(text)


@dataclass(frozen=True)
class Health:
    """nvml_api.GpuHealth, by the GPU's CUDA index."""
    index: int = spec(small, required=True)
    ecc_enabled: bool | None = spec(flag)
    ecc_uncorrected_volatile: int | None = spec(size)
    ecc_uncorrected_aggregate: int | None = spec(size)
    ecc_corrected_volatile: int | None = spec(size)
    retired_pages: int | None = spec(size)
    retired_pending: bool | None = spec(flag)
    remapped_correctable: int | None = spec(size)
    remapped_uncorrectable: int | None = spec(size)
    remap_pending: bool | None = spec(flag)
    remap_failed: bool | None = spec(flag)
    clock_events: tuple | None = spec(list_of(text, "reasons", most=64))


@dataclass(frozen=True)
class Xid:
    pci: str = spec(text, required=True)
    xid: int = spec(small, required=True)
    text: str | None = spec(text)


@dataclass(frozen=True)
class KernelXids:
    xids: tuple | None = spec(list_of(record(Xid), "XID records", most=100_000))
    unreadable: str | None = spec(text)


@dataclass(frozen=True)
class Gpus:
    gpus: tuple = spec(list_of(record(Gpu), "GPUs", most=4096), factory=tuple)
    driver: str | None = spec(text)
    cuda: str | None = spec(text)
    nvlink: bool | None = spec(flag)
    p2p: tuple | None = spec(list_of(list_of(text, "links"), "rows", most=4096))
    consumer: bool = spec(flag, False)
    reason: str | None = spec(text)
    health: tuple = spec(list_of(record(Health), "GPUs' health", most=4096), factory=tuple)
    kernel_xids: KernelXids | None = spec(record(KernelXids))


@dataclass(frozen=True)
class Space:
    """node.space(): a directory's file system."""
    path: str | None = spec(text)
    at: str | None = spec(text)
    total: int | None = spec(size)
    free: int | None = spec(size)
    writable: bool | None = spec(flag)
    write_error: str | None = spec(text)
    error: str | None = spec(text)


def _soft_hard(v: Any) -> tuple:
    """[soft, hard], each a count or null (unlimited)."""
    if not (isinstance(v, list) and len(v) == 2):
        raise Bad("[soft, hard]")
    return tuple(nullable(size)(x) for x in v)


def _pids(v: Any) -> tuple:
    if not (isinstance(v, list) and len(v) == 2):
        raise Bad("[pids.max, pids.current]")
    return tuple(size(x) for x in v)


@dataclass(frozen=True)
class Limits:
    ram_total: int | None = spec(size)
    ram_available: int | None = spec(size)
    memlock: int | None = spec(size)
    cwd: str | None = spec(text)
    disk: dict = spec(map_of(_text_key, nullable(size), "paths to free bytes"), factory=dict)
    shm_total: int | None = spec(size)
    shm: Space | None = spec(record(Space))
    checkpoint: Space | None = spec(record(Space))
    nofile: tuple | None = spec(_soft_hard)
    nproc: tuple | None = spec(_soft_hard)
    user_threads: int | None = spec(size)
    pids: tuple | None = spec(_pids)
    root: bool | None = spec(flag)


@dataclass(frozen=True)
class Net:
    interfaces: tuple = spec(list_of(text, "interface names"), factory=tuple)
    ib_devices: tuple = spec(list_of(text, "device names"), factory=tuple)
    env: dict = spec(map_of(_text_key, text, "variables to values"), factory=dict)


def _address(v: Any) -> tuple[int, str]:
    if not (isinstance(v, list) and len(v) == 2):
        raise Bad("[4 or 6, address]")
    return one_of(4, 6)(v[0]), text(v[1])


@dataclass(frozen=True)
class Resolved:
    addresses: tuple = spec(list_of(_address, "[family, address] pairs"), factory=tuple)
    error: str | None = spec(text)


@dataclass(frozen=True)
class Facts:
    host: str = spec(text, required=True)
    pid: int | None = spec(small)
    failed: Outcome | None = spec(record(Outcome))
    versions: Any = spec(fact(Versions))
    gpus: Any = spec(fact(Gpus))
    limits: Any = spec(fact(Limits))
    net: Any = spec(fact(Net))
    resolve: Any = spec(fact(Resolved))


# ----------------------------------------------------------------------------- the collective's result


bandwidth = number(0.0, 1e12, "a bandwidth in Gb/s")


@dataclass(frozen=True)
class OpRun:
    """One operation at one size (collective.time_op): its figures, or why it could not run."""
    bytes: int = spec(size, required=True)
    samples: int | None = spec(small)
    seconds: float | None = spec(seconds)
    busbw_gbps: float | None = spec(bandwidth)
    low_gbps: float | None = spec(bandwidth)
    high_gbps: float | None = spec(bandwidth)
    check: str | None = spec(text)
    unsupported: str | None = spec(text)


@dataclass(frozen=True)
class Scope:
    ranks: int = spec(small, required=True)
    ops: dict = spec(map_of(one_of(*measure.OPS), list_of(record(OpRun), "sizes", most=64), "operations to runs"),
                     factory=dict)


@dataclass(frozen=True)
class Link:
    """One measurement of the ring pass (collective.ring_pass)."""
    k: int = spec(small, required=True)
    to: int = spec(rank, required=True)
    frm: int = spec(rank, required=True, key="from")
    bytes: int = spec(size, required=True)
    gbps: float = spec(bandwidth, required=True)
    low_gbps: float | None = spec(bandwidth)
    high_gbps: float | None = spec(bandwidth)
    samples: int | None = spec(small)
    check: str | None = spec(text)


def _xid_event(v: Any) -> tuple:
    if not (isinstance(v, list) and len(v) == 2):
        raise Bad("[GPU index, XID]")
    return integer(-1, 1 << 16, "a GPU index")(v[0]), small(v[1])


@dataclass(frozen=True)
class NcclLog:
    version: str | None = spec(text)
    network: str | None = spec(text)
    socket: str | None = spec(text)
    ib: str | None = spec(text)
    bootstrap: str | None = spec(text)
    warnings: tuple = spec(list_of(text, "warnings"), factory=tuple)


@dataclass(frozen=True)
class Collective:
    timeout: float | None = spec(seconds)
    error: str | None = spec(text)
    rank: int | None = spec(small)
    torch: str | None = spec(text)
    nccl_version: str | None = spec(text)
    p2p: dict = spec(map_of(_text_key, text, "GPU pairs to what their copy did"), factory=dict)
    scopes: dict = spec(map_of(one_of("node", "across"), record(Scope), "scopes to figures"), factory=dict)
    ring: tuple = spec(list_of(record(Link), "ring measurements", most=64), factory=tuple)
    xids: tuple = spec(list_of(_xid_event, "XID events", most=10_000), factory=tuple)
    what: str | None = spec(text)
    nccl_log: NcclLog | None = spec(record(NcclLog))
    cancelled: str | None = spec(text)


# ----------------------------------------------------------------------------- the messages


@dataclass(frozen=True)
class Hello:
    """A node's first message: its rank, its nonce and its proof of the secret."""
    rank: int = spec(rank, required=True)
    nonce: str = spec(hexdigest, required=True)
    proof: str = spec(hexdigest, required=True)


@dataclass(frozen=True)
class Reach:
    kind: str = spec(one_of("ok", "refused", "timeout", "unreachable", "noroute", "unresolved", "foreign", "self",
                            "version", "unauthenticated"), required=True)
    seconds: float | None = spec(seconds)
    detail: str | None = spec(text)
    pid: int | None = spec(small)


@dataclass(frozen=True)
class Joining:
    """A node's facts, sent once the main node proved the secret back."""
    facts: Facts = spec(record(Facts), required=True)
    reach: Reach | None = spec(record(Reach))


@dataclass(frozen=True)
class Go:
    port: int = spec(integer(1, 65535, "a TCP port"), required=True)
    backend: str = spec(one_of("gloo", "nccl"), required=True)
    nbytes: int = spec(integer(1, 1 << 40, "a number of bytes"), required=True)


@dataclass(frozen=True)
class RowMsg:
    """A row of the table (checks.Row), as the main node sends a node the ones about it and the cause."""
    node: int = spec(rank, required=True)
    host: str = spec(text, required=True)
    check: str = spec(text, required=True)
    status: str = spec(one_of("ok", "info", "warn", "fail"), required=True)
    detail: str = spec(text, required=True)
    fix: str | None = spec(text)


@dataclass(frozen=True)
class FromMain:
    """What the main node sends a node after it joined: the collective's go (or why it is skipped), a stop of the
    collective under way (another node's failed: the cause), an abort, the verdict with the rows about this node
    and the cause."""
    go: Go | None = spec(record(Go))
    skip: str | None = spec(text)
    stop: str | None = spec(text)
    abort: str | None = spec(text)
    verdict: str | None = spec(text)
    exit_code: int | None = spec(integer(0, 255, "an exit code (0-255)"))
    rows: tuple = spec(list_of(record(RowMsg), "rows", most=10_000), factory=tuple)
    welcome: str | None = spec(hexdigest)


def check(cls: type, body: Any) -> tuple[Any, str | None]:
    """(cls from body, None), or (None, one line naming what is wrong)."""
    try:
        return build(cls, body), None
    except SchemaError as exc:
        return None, str(exc)

