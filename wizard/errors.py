"""Errors that the CLI turns into exit codes (see DESIGN.md, CLI contract)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOTHING_FITS = 3
EXIT_WRITTEN_BUT_FAILED = 4   # files on disk changed, then the command failed: the message names what is new
EXIT_INTERRUPTED = 130

# The stop signal (SIGINT, SIGTERM, SIGHUP) this process received, recorded before anything acts on it. A
# KeyboardInterrupt raised inside a library's import can come out as another error (an ImportError, a
# RecursionError) or be swallowed; the CLI trusts this record, not the exception, and a set write does not
# start once it is set.
_stop: list[int] = []


def note_stop(signum: int) -> None:
    if not _stop:
        _stop.append(signum)


def stop_signal() -> int | None:
    return _stop[0] if _stop else None


def clear_stop() -> None:
    _stop.clear()


class WizardError(Exception):
    exit_code = 1


class InputError(WizardError):
    """Bad input from a flag, an answers file or a screen field.

    The message is one line naming the field and what is allowed; the CLI prints it and
    exits 2 without writing anything.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, field: str, problem: str, allowed: str | None = None):
        self.field = field
        self.problem = problem
        self.allowed = allowed
        text = f"{field}: {problem}"
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)
