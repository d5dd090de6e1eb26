"""Errors that the CLI turns into exit codes (see DESIGN.md, CLI contract)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOTHING_FITS = 3
EXIT_INTERRUPTED = 130


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
