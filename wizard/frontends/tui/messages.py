"""Typed messages between the wizard's widgets, screens, worker threads and the app.

Worker threads never touch widgets: they post one of these (post_message is thread-safe) and the
app updates the state and the screens on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


# What the app returns when it ends: the screens build it (Done), the CLI reads it.
@dataclass
class Outcome:
    code: int                                   # the exit code of `wizard`
    written: list = field(default_factory=list)  # fsutil.WriteResult of each file
    launch: list[str] | None = None             # argv of `wizard launch ...` to exec into
    summary: list[str] = field(default_factory=list)  # lines printed after the screen is gone


class AnswerEntered(Message):
    """A question's field holds a valid value the user typed or chose."""

    def __init__(self, qid: str, value: Any) -> None:
        super().__init__()
        self.qid = qid
        self.value = value


class AnswerInvalid(Message):
    """A question's field holds something Question.parse refused; `error` is the InputError text."""

    def __init__(self, qid: str, error: str) -> None:
        super().__init__()
        self.qid = qid
        self.error = error


class FieldFocused(Message):
    """Focus moved into a question's field: the help line shows its help and why its default."""

    def __init__(self, qid: str) -> None:
        super().__init__()
        self.qid = qid


class HardwareReady(Message):
    """The probe (or --hardware/--assume) finished in its thread."""

    def __init__(self, hardware: Any, error: str | None = None) -> None:
        super().__init__()
        self.hardware = hardware
        self.error = error


class ModelSized(Message):
    """A model config was sized in its thread (shape), or could not be (error: an InputError)."""

    def __init__(self, model_arg: str, shape: Any, error: Exception | None) -> None:
        super().__init__()
        self.model_arg = model_arg
        self.shape = shape
        self.error = error


class ValidationDone(Message):
    """The rendered files were loaded by accelerate, DeepSpeed and transformers (findings), or the
    validation itself crashed (error)."""

    def __init__(self, token: int, findings: list, error: str | None = None) -> None:
        super().__init__()
        self.token = token
        self.findings = findings
        self.error = error


class StateChanged(Message):
    """The plan or the answers changed: the active screen re-reads the state."""
