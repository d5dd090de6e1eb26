"""Parsing and formatting of sizes and counts: '7B', '80GB', '512G', '1.5e9'; and text from elsewhere made safe
to print (`printable`)."""

from __future__ import annotations

import re

from wizard.errors import InputError

GiB = 1024**3
MiB = 1024**2

_COUNT_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
# Memory sizes: GPU vendors and `free` both mean binary units when they say GB, so do we.
_BYTES_SUFFIX = {
    "": 1, "B": 1,
    "K": 1024, "KB": 1024, "KIB": 1024,
    "M": MiB, "MB": MiB, "MIB": MiB,
    "G": GiB, "GB": GiB, "GIB": GiB,
    "T": 1024**4, "TB": 1024**4, "TIB": 1024**4,
}


MAX_PARSED = 1e18   # counts and sizes: far above any real model or machine, far below float overflow

# A machine's network to the others (Gb/s, all NICs together). Below 0.1 Gb/s (100 Mb/s) it is not a training
# network: a step would take days, and a value near zero drives the step time to infinity and a speed to zero.
# 100,000 is far above any machine's NICs (8 x 800 Gb/s is 6,400).
NETWORK_GBPS_MIN = 0.1
NETWORK_GBPS_MAX = 100_000
NETWORK_GBPS_RANGE = "a number from 0.1 to 100000"


def is_network_gbps(value: object) -> bool:
    """True for a network speed the planner accepts (Gb/s per machine): a real number in the range above."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and NETWORK_GBPS_MIN <= value <= NETWORK_GBPS_MAX)


def parse_count(text: str | int | float, field: str) -> int:
    """'7B' -> 7_000_000_000, '350M' -> 350_000_000, '1.5e9' -> 1_500_000_000. Positive only."""
    if isinstance(text, bool):
        raise InputError(field, f"{text!r} is not a number", "a positive count such as 7B, 350M or 1.5e9")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", str(text))
        if not m:
            raise InputError(field, f"{text!r} is not a count", "a positive count such as 7B, 350M or 1.5e9")
        value = float(m.group(1)) * _COUNT_SUFFIX[m.group(2).upper()]
    if value <= 0:
        raise InputError(field, f"{text!r} must be greater than zero", "a positive count such as 7B, 350M or 1.5e9")
    if not value < MAX_PARSED:     # also inf and nan: int() of them raises, and no real count is near 1e18
        raise InputError(field, f"{_short(text)} is too large", "a positive count below 1e18 such as 7B")
    return int(round(value))


def parse_bytes(text: str | int, field: str) -> int:
    """'80GB' / '80G' / '80GiB' -> 80 GiB in bytes. Positive only."""
    if isinstance(text, bool):
        raise InputError(field, f"{text!r} is not a size", "a size such as 80G, 512GB or 24GiB")
    if isinstance(text, int):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).upper() not in _BYTES_SUFFIX:
            raise InputError(field, f"{text!r} is not a size", "a size such as 80G, 512GB or 24GiB")
        value = float(m.group(1)) * _BYTES_SUFFIX[m.group(2).upper()]
    if value <= 0:
        raise InputError(field, f"{text!r} must be greater than zero", "a size such as 80G, 512GB or 24GiB")
    if not value < MAX_PARSED:
        raise InputError(field, f"{_short(text)} is too large", "a size below 1e18 bytes such as 80G")
    return int(value)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"...' ({len(str(value))} characters)"


def fmt_bytes(n: int | float | None) -> str:
    """Human size in binary units with one decimal: 1.5 GiB. None -> 'N/A'."""
    if n is None:
        return "N/A"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def fmt_bytes_apart(need: int | float, have: int | float) -> tuple[str, str]:
    """fmt_bytes of two sizes with enough decimals that unequal sizes never read alike ("needs 1.1 TiB but
    1.1 TiB is available" becomes "1.13 TiB ... 1.12 TiB")."""
    a, b = fmt_bytes(need), fmt_bytes(have)
    if a != b or need == have:
        return a, b
    for unit, scale in (("KiB", 1024), ("MiB", 1024 ** 2), ("GiB", 1024 ** 3), ("TiB", 1024 ** 4), ("PiB", 1024 ** 5)):
        if a.endswith(" " + unit):
            for digits in (2, 3, 4):
                a2, b2 = f"{need / scale:.{digits}f} {unit}", f"{have / scale:.{digits}f} {unit}"
                if a2 != b2:
                    return a2, b2
    return f"{need:,.0f} B", f"{have:,.0f} B"


def fmt_count(n: int | None) -> str:
    """Parameter counts as people say them: 6.74B, 124M, 12.3K."""
    if n is None:
        return "N/A"
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}" if n / div < 100 else f"{n / div:.0f}{suffix}"
    return str(n)


# ----------------------------------------------------------------------------- durations (one home)

def fmt_duration(seconds: float) -> str:
    """A planned duration: 3725 -> '1h 02m'; 1.5e6 -> '17.4 days'."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m {seconds % 60:02.0f}s"
    if seconds < 48 * 3600:
        return f"{seconds // 3600:.0f}h {(seconds % 3600) // 60:02.0f}m"
    return f"{seconds / 86400:.1f} days"


def fmt_clock(seconds: float | None, *, unknown: str = "--:--", pad_minutes: bool = True) -> str:
    """A running clock: "05:03" (or "5:03" unpadded, as the headless status line prints it), "1:02:03";
    `unknown` when there is no figure."""
    if seconds is None:
        return unknown
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}:{m:02d}:{s:02d}"
    return f"{m:02d}:{s:02d}" if pad_minutes else f"{m}:{s:02d}"


# C0 and C1 control characters, DEL, the line and paragraph separators, the bidirectional overrides (which make
# text read in another order than it is), and lone surrogates (which no terminal encoding can print)
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def printable(value: object, limit: int = 200) -> str:
    """Text that came from elsewhere (a peer over the network, a file someone else may have written), made safe to
    put on a terminal line: control characters as \\xNN escapes (so no escape sequence reaches the terminal and no
    newline starts a forged line), lone surrogates as \\uDXXX, and at most `limit` characters."""
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                            else f"\\u{ord(m.group()):04x}", text)
