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


@dataclass(frozen=True)
class Gpus:
    gpus: tuple = spec(list_of(record(Gpu), "GPUs", most=4096), factory=tuple)
    driver: str | None = spec(text)
    cuda: str | None = spec(text)
    nvlink: bool | None = spec(flag)
    p2p: tuple | None = spec(list_of(list_of(text, "links"), "rows", most=4096))
    consumer: bool = spec(flag, False)
    reason: str | None = spec(text)


@dataclass(frozen=True)
class Limits:
    ram_total: int | None = spec(size)
    ram_available: int | None = spec(size)
    memlock: int | None = spec(size)
    cwd: str | None = spec(text)
    disk: dict = spec(map_of(_text_key, nullable(size), "paths to free bytes"), factory=dict)
    shm_total: int | None = spec(size)


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


def _scope(v: Any) -> dict:
    """One all-reduce scope: {"ranks": 1} when there was nothing to measure, else every figure."""
    if not isinstance(v, dict):
        raise Bad("an object")
    ranks = small(v.get("ranks"))
    if ranks < 2:
        return {"ranks": ranks}
    return {"ranks": ranks, **build_fields(Scope, v)}


@dataclass(frozen=True)
class Scope:
    bytes: int = spec(size, required=True)
    iterations: int = spec(small, required=True)
    seconds: float = spec(seconds, required=True)
    busbw_gbps: float = spec(number(0.0, 1e12, "a bandwidth in Gb/s"), required=True)


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
    scopes: dict = spec(map_of(one_of("node", "across"), _scope, "scopes to figures"), factory=dict)
    nccl_log: NcclLog | None = spec(record(NcclLog))


def build_fields(cls: type, v: dict[str, Any]) -> dict[str, Any]:
    """cls's checked fields of v, as a dict (for a check that returns plain data)."""
    from dataclasses import asdict
    return asdict(record(cls)(v))


# ----------------------------------------------------------------------------- the messages


@dataclass(frozen=True)
class Hello:
    """A node's first message: its rank, its nonce and its proof of the secret."""
    rank: int = spec(rank, required=True)
    nonce: str = spec(hexdigest, required=True)
    proof: str = spec(hexdigest, required=True)


@dataclass(frozen=True)
class Reach:
    kind: str = spec(one_of("ok", "refused", "timeout", "unreachable", "foreign", "self", "version",
                            "unauthenticated"), required=True)
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
class FromMain:
    """What the main node sends a node after it joined: the collective's go (or why it is skipped), an abort, the
    verdict."""
    go: Go | None = spec(record(Go))
    skip: str | None = spec(text)
    abort: str | None = spec(text)
    verdict: str | None = spec(text)
    exit_code: int | None = spec(integer(0, 255, "an exit code (0-255)"))
    welcome: str | None = spec(hexdigest)


def check(cls: type, body: Any) -> tuple[Any, str | None]:
    """(cls from body, None), or (None, one line naming what is wrong)."""
    try:
        return build(cls, body), None
    except SchemaError as exc:
        return None, str(exc)

