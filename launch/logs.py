"""Per-rank log capture and parsing: Trainer log dicts, tqdm progress, failure markers.

`StreamCapture.feed(bytes)` takes whatever a rank wrote (stdout and stderr share one stream),
splits it on newlines and carriage returns, and
- appends it to the rank's log (tqdm redraws, which end in '\r', are kept at most one per
  PROGRESS_LOG_EVERY_S seconds, so a long run's log is not mostly progress bars);
- echoes whole lines as `[rankN] line` when headless;
- hands parsed Trainer log dicts and tqdm progress to callbacks;
- remembers when the rank last wrote anything (stall detection) and whether a traceback, a CUDA
  out-of-memory or an NCCL error went by (failure classification).

The fast path (a chunk with no '\r' and no marker text) is a few bytes.find() calls and one
write(): capture runs well above 100,000 lines/s (bench/bench_launch.py). Memory is bounded: a
partial line longer than MAX_LINE_BYTES is cut and treated as a line.
"""

from __future__ import annotations

import ast
import re
import time
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable

MAX_LINE_BYTES = 64 * 1024
PROGRESS_LOG_EVERY_S = 5.0

# `{'loss': 1.23, 'grad_norm': 0.5, 'learning_rate': 5e-05, 'epoch': 0.1}` (transformers 4) or the
# same with quoted numbers (transformers 5 formats them: {'loss': '4.865', ...}).
_DICT_RE = re.compile(r"\{'(?:loss|eval_loss|train_runtime)'.*?\}")
TRAIN_LOG_KEYS = ("loss", "learning_rate", "grad_norm", "epoch")

# tqdm: ` 12%|█▏  | 12/100 [00:03<00:20,  4.20it/s]` or `[00:03<00:20, 1.25s/it]`
_TQDM_RE = re.compile(
    r"(\d+)/(\d+) \[([\d:]+)<([\d:?]+)?,\s*(\?|[\d.]+)\s*(it/s|s/it|[A-Za-z]+/s|s/[A-Za-z]+)\]")

_MARKERS = (b"Traceback", b"Error", b"out of memory", b"NCCL", b"Watchdog", b"died", b"Killed")


def parse_number(v: Any) -> float | None:
    """A number printed in a log line (text such as "1.5e-05" too): float, else None."""
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def parse_trainer_log(line: str) -> dict[str, Any] | None:
    """The Trainer's printed log dict as numbers, or None. Keeps every key whose value is numeric."""
    if "{'" not in line:
        return None
    m = _DICT_RE.search(line)
    if not m:
        return None
    try:
        raw = ast.literal_eval(m.group(0))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    out: dict[str, Any] = {}
    for k, v in raw.items():
        n = parse_number(v)
        if n is not None:
            out[str(k)] = n
    return out or None


def _hms_to_s(text: str | None) -> float | None:
    if not text or "?" in text:
        return None
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        return None
    s = 0
    for p in parts:
        s = s * 60 + p
    return float(s)


def parse_tqdm(line: str) -> dict[str, Any] | None:
    """tqdm's bar as {"step", "total", "elapsed_s", "eta_s", "rate"} (rate in it/s), or None."""
    if "/" not in line or "[" not in line:
        return None
    m = None
    for m in _TQDM_RE.finditer(line):   # the last bar on the line is the newest
        pass
    if m is None:
        return None
    step, total = int(m.group(1)), int(m.group(2))
    rate = parse_number(m.group(5))
    unit = m.group(6)
    if rate is not None and unit.startswith("s/"):
        rate = 1.0 / rate if rate > 0 else None
    return {"step": step, "total": total, "elapsed_s": _hms_to_s(m.group(3)),
            "eta_s": _hms_to_s(m.group(4)), "rate": rate}


@dataclass
class Markers:
    """Failure evidence seen in a stream (times are epoch seconds of first sight)."""
    traceback_at: float | None = None
    cuda_oom_at: float | None = None
    nccl_at: float | None = None
    last_exception: str | None = None   # last line that looked like `SomeError: message`
    train_done_at: float | None = None  # the Trainer's end-of-training summary ({'train_runtime': ...})


_TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
_EXC_LINE_RE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Exit)|\w+Error\b)(?::\s.*)?$")


def after_progress_bar(line: str) -> str:
    """What follows the last tqdm bar on a line. tqdm draws '\r' + bar and leaves the line open, so
    whatever the rank writes next (under DeepSpeed, torch's "[rank1]: Traceback ...") lands on the
    bar's line: `  4%|▍  | 2/50 [00:00<00:07,  6.37it/s][rank1]: Traceback (most recent call last):`."""
    end = None
    for m in _TQDM_RE.finditer(line):
        end = m.end()
    return line if end is None else line[end:].lstrip()


def exception_line(line: str) -> str | None:
    """`ValueError: boom` style lines (the last line of a Python traceback)."""
    s = line.strip()
    if not s or s.startswith(("File ", "[", "Traceback")) or len(s) > 2000:
        return None
    return s if _EXC_LINE_RE.match(s) else None


class StreamCapture:
    """One output stream (a rank, or the launcher): log file, echo, parsing, markers, liveness."""

    def __init__(self, rank: int | None, log: Any | None = None, echo: BinaryIO | None = None,
                 prefix: bytes | None = None,
                 on_train_log: Callable[[int | None, dict[str, Any]], None] | None = None,
                 on_progress: Callable[[int | None, dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.time):
        self.rank = rank
        self.log = log
        self.echo = echo
        self.prefix = prefix if prefix is not None else (
            f"[rank{rank}] ".encode() if rank is not None else b"[launcher] ")
        self.on_train_log = on_train_log
        self.on_progress = on_progress
        self.clock = clock
        self.buf = b""
        self.bytes_in = 0
        self.lines = 0
        self.last_output_at: float | None = None
        self.last_progress_log_at = 0.0
        self.markers = Markers()
        self.closed_at: float | None = None
        self.pid: int | None = None

    # ---------------------------------------------------------------- feeding

    def feed(self, data: bytes) -> None:
        if not data:
            return
        now = self.clock()
        self.last_output_at = now
        self.bytes_in += len(data)
        buf = self.buf + data if self.buf else data
        hold = b""
        if buf.endswith(b"\r"):           # maybe the first half of '\r\n': decide with the next byte
            buf, hold = buf[:-1], b"\r"
        cut = max(buf.rfind(b"\n"), buf.rfind(b"\r"))
        if cut < 0:
            if len(buf) > MAX_LINE_BYTES:
                self._complete(buf + b"\n", now)
                buf = b""
            self.buf = buf + hold
        else:
            complete, self.buf = buf[:cut + 1], buf[cut + 1:] + hold
            self._complete(complete, now)
        # tqdm draws '\r' + bar: the newest bar waits for the next '\r'; read it now
        pending = self.buf
        if pending and (b"it/s]" in pending or b"s/it]" in pending) and self.on_progress:
            prog = parse_tqdm(pending.decode("utf-8", "replace"))
            if prog is not None:
                self.on_progress(self.rank, prog)

    def close(self) -> None:
        """End of stream: flush a partial last line."""
        if self.buf:
            self._complete(self.buf + b"\n", self.clock())
            self.buf = b""
        self.closed_at = self.clock()

    # ---------------------------------------------------------------- internals

    def _complete(self, chunk: bytes, now: float) -> None:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        if b"\r" not in chunk:
            self._lines_block(chunk, now)
            return
        # tqdm redraws: segments ending in '\r' are transient
        out: list[bytes] = []
        start = 0
        n = len(chunk)
        while start < n:
            i_r = chunk.find(b"\r", start)
            i_n = chunk.find(b"\n", start)
            if i_r < 0 and i_n < 0:
                break
            if i_n >= 0 and (i_r < 0 or i_n < i_r):
                out.append(chunk[start:i_n + 1])
                start = i_n + 1
                continue
            seg = chunk[start:i_r]
            start = i_r + 1
            if seg.strip():
                self._progress_segment(seg, now, out)
        if out:
            self._lines_block(b"".join(out), now)

    def _progress_segment(self, seg: bytes, now: float, out: list[bytes]) -> None:
        text = seg.decode("utf-8", "replace")
        prog = parse_tqdm(text)
        if prog is not None:
            if self.on_progress:
                self.on_progress(self.rank, prog)
            final = prog["total"] and prog["step"] >= prog["total"]
            if final or now - self.last_progress_log_at >= PROGRESS_LOG_EVERY_S:
                self.last_progress_log_at = now
                if self.log is not None:
                    self.log.write(seg.strip() + b"\n")
            return
        out.append(seg + b"\n")    # not a progress bar: an ordinary line that ended in '\r'

    def _lines_block(self, block: bytes, now: float) -> None:
        if self.log is not None:
            self.log.write(block)
        count = block.count(b"\n")
        self.lines += count
        if self.echo is not None:
            lines = block.split(b"\n")
            if lines and lines[-1] == b"":
                lines.pop()
            p = self.prefix
            try:
                self.echo.write(b"".join(p + ln + b"\n" for ln in lines))
            except (OSError, ValueError):
                self.echo = None
        want_dict = b"{'" in block
        want_bar = b"it/s]" in block or b"s/it]" in block
        want_marker = any(m in block for m in _MARKERS)
        if not (want_dict or want_bar or want_marker):
            return
        for raw in block.split(b"\n"):
            if not raw:
                continue
            text = raw.decode("utf-8", "replace")
            if want_dict:
                d = parse_trainer_log(text)
                if d is not None and "train_runtime" in d and self.markers.train_done_at is None:
                    self.markers.train_done_at = now       # the script's last training line
                if d is not None and self.on_train_log:
                    self.on_train_log(self.rank, d)
            if want_bar:
                prog = parse_tqdm(text)
                if prog is not None and self.on_progress:
                    self.on_progress(self.rank, prog)
            if want_marker:
                self._markers(text, now)

    def _markers(self, text: str, now: float) -> None:
        m = self.markers
        if "/s]" in text or "s/it]" in text:
            text = after_progress_bar(text)
        if text.startswith("[rank"):    # torch prefixes a distributed rank's traceback: "[rank1]: ..."
            text = _TORCH_RANK_PREFIX.sub("", text, count=1)
        if m.traceback_at is None and text.startswith("Traceback (most recent call last)"):
            m.traceback_at = now
        if m.cuda_oom_at is None and ("CUDA out of memory" in text or "OutOfMemoryError" in text):
            m.cuda_oom_at = now
        if m.nccl_at is None and ("NCCL" in text and ("Watchdog" in text or "timeout" in text.lower()
                                                      or "error" in text.lower() or "abort" in text.lower())):
            m.nccl_at = now
        exc = exception_line(text)
        if exc is not None:
            m.last_exception = exc
