"""Checking data that comes from elsewhere (a file in a run directory, a message from another node) against a schema
written as frozen dataclasses: each field names its check with `spec`, and `build(cls, body)` returns the dataclass
with every value checked and converted, or raises SchemaError naming the field ("gpus.gpus[2].memory_total: 'zz' is
not a number of bytes"). Pure and small; the schemas themselves live with their data (launch/runschema.py for
run.json, wizard/preflight/messages.py for what the preflight's nodes send each other).

Fields a schema does not name are ignored (a newer writer's additions are not an error); a field left out or null
takes its default, unless it is `required`.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields
from typing import Any, Callable

from wizard.units import printable

TEXT_MAX = 1 << 20              # characters: far above any name, path, argument or message a schema holds
INT64_MAX = (1 << 63) - 1


class SchemaError(ValueError):
    """One line: which field is wrong and what it should be. `field` is its path ("classification.kind")."""

    def __init__(self, where: str, problem: str):
        self.field = where
        super().__init__(f"{where}: {problem}" if where else problem)


class Bad(ValueError):
    """A value that is not what its field holds: `what` completes "... is not <what>", `where` is the path inside
    the field ("[3]", ".kind"), `value` the offending value (unset: the field's own)."""

    def __init__(self, what: str, where: str = "", value: Any = MISSING):
        super().__init__(what)
        self.what, self.where, self.value = what, where, value

    def inside(self, step: str, value: Any) -> "Bad":
        return Bad(self.what, step + self.where, value if self.value is MISSING else self.value)


Check = Callable[[Any], Any]


# ----------------------------------------------------------------------------- checks of one value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def integer(low: int, high: int, what: str) -> Check:
    def check(v: Any) -> int:
        if not (_is_int(v) and low <= v <= high):
            raise Bad(what)
        return v
    return check


def number(low: float, high: float, what: str) -> Check:
    """A finite number within [low, high], as a float."""
    def check(v: Any) -> float:
        if not (_is_number(v) and math.isfinite(v) and low <= v <= high):
            raise Bad(what)
        return float(v)
    return check


def any_number(v: Any) -> float:
    """Any number, NaN and infinity included (a diverged loss is one)."""
    if not _is_number(v):
        raise Bad("a number")
    return float(v)


def text(v: Any) -> str:
    if not isinstance(v, str) or len(v) > TEXT_MAX:
        raise Bad("text" if not isinstance(v, str) else f"text of at most {TEXT_MAX} characters")
    return v


def flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise Bad("true or false")
    return v


def one_of(*allowed: Any) -> Check:
    def check(v: Any) -> Any:
        if isinstance(v, bool) or v not in allowed:
            raise Bad(f"one of {', '.join(map(str, allowed))}")
        return v
    return check


def nullable(check: Check) -> Check:
    """check, or null (inside a list or a map, where a field's own default does not apply)."""
    def inner(v: Any) -> Any:
        return None if v is None else check(v)
    return inner


def list_of(item: Check, what: str, most: int = 1 << 20) -> Check:
    def check(v: Any) -> tuple:
        if not isinstance(v, list) or len(v) > most:
            raise Bad(f"a list of {what}")
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except Bad as bad:
                raise bad.inside(f"[{i}]", x) from None
        return tuple(out)
    return check


def map_of(key: Callable[[str], Any], value: Check, what: str) -> Check:
    def check(v: Any) -> dict:
        if not isinstance(v, dict):
            raise Bad(f"an object mapping {what}")
        out = {}
        for k, x in v.items():
            step = f"[{printable(repr(k), 40)}]"
            try:
                kk = key(k)
            except Bad as bad:
                raise bad.inside(step, k) from None
            try:
                out[kk] = value(x)
            except Bad as bad:
                raise bad.inside(step, x) from None
        return out
    return check


def digits(k: Any) -> int:
    """A JSON key that holds a number ("3": JSON keys are text)."""
    if not (isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 18):
        raise Bad("a number as the key")
    return int(k)


def record(cls: type) -> Check:
    """A nested object checked against another schema dataclass."""
    def check(v: Any) -> Any:
        if not isinstance(v, dict):
            raise Bad("an object")
        return _build(cls, v)
    return check


# ----------------------------------------------------------------------------- schemas


def spec(check: Check, default: Any = None, *, required: bool = False, factory: Callable[[], Any] | None = None,
         key: str | None = None) -> Any:
    """A schema field: its check, and what it is when the body leaves it out or null (a required one may not).
    `key`: the body's name for it, where that is no Python name."""
    meta = {"check": check, "required": required, "key": key}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _build(cls: type, body: dict[str, Any], **extra: Any) -> Any:
    values: dict[str, Any] = {}
    for f in fields(cls):
        if "check" not in f.metadata:
            continue
        key = f.metadata["key"] or f.name
        v = body.get(key)
        try:
            if v is None:
                if f.metadata["required"]:
                    raise Bad("missing" if key not in body else "null, and it is required")
                continue                    # the dataclass default
            values[f.name] = f.metadata["check"](v)
        except Bad as bad:
            raise bad.inside(f".{key}", v) from None
    return cls(**values, **extra)


def build(cls: type, body: Any, **extra: Any) -> Any:
    """cls from a JSON body, every field through its check; SchemaError (one line naming the field) otherwise.
    `extra`: values for the dataclass's own fields that are no part of the body (the raw body, say)."""
    if not isinstance(body, dict):
        raise SchemaError("", f"{printable(repr(body), 40)} is not a JSON object")
    try:
        return _build(cls, body, **extra)
    except Bad as bad:
        where = bad.where.removeprefix(".")
        if bad.what.startswith(("missing", "null")):
            raise SchemaError(where, bad.what) from None
        raise SchemaError(where, f"{printable(repr(bad.value), 60)} is not {bad.what}") from None


def problem(cls: type, body: Any) -> str | None:
    """What is wrong with body as a cls, in one line; None when it passes."""
    try:
        build(cls, body)
    except SchemaError as exc:
        return str(exc)
    return None
