"""The wizard's Textual app: screens in order, the shared state, and the threads that do slow work.

`make_app(request, hardware=...)` is the one way to build it, for `wizard` and for the tests.
The app returns an Outcome from `run()`: written (0), quit with Ctrl+Q (0, nothing written), cancelled by Ctrl+C or a
signal (130), or a launch to exec into.

Slow work never runs on the event loop: probing the hardware, sizing a model from its config
(imports transformers) and validating the files (imports accelerate, DeepSpeed, transformers)
run in thread workers that post typed messages back. One lock keeps the heavy imports in one
thread at a time (two threads importing the same package tree can see half-initialised modules).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from textual import events, work
from textual.app import App
from textual.binding import Binding

from wizard import pipeline
from wizard.errors import EXIT_INTERRUPTED, InputError
from wizard.frontends.session import WizardState
from wizard.frontends.tui.messages import HardwareReady, ModelSized, Outcome, StateChanged, ValidationDone
from wizard.probe.hardware import Hardware

HEAVY_IMPORTS = threading.Lock()
SIZING_DEBOUNCE_S = 0.2
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")
STOP_DEADLINE_S = 5.0      # a stop signal ends the process by then, even if a worker thread is still busy


def _terminal_alive() -> bool:
    """Whether the controlling terminal still answers (a hung-up one fails tcgetattr with EIO)."""
    import termios
    try:
        termios.tcgetattr(sys.__stdin__.fileno())
        return True
    except (termios.error, OSError, ValueError, AttributeError):
        return False


def _exit_after(seconds: float) -> None:
    """A daemon timer that ends the process if the orderly exit has not finished by then: a thread
    that will not stop (a sizing import, a Textual thread on a dead terminal) must not keep it alive."""
    def deadline() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(EXIT_INTERRUPTED)

    timer = threading.Timer(seconds, deadline)
    timer.daemon = True
    timer.start()




def quit_outcome(chosen: bool) -> Outcome:
    """Leaving before anything was written: by the Quit key (a choice: exit 0) or by Ctrl+C (an interrupt: 130)."""
    if chosen:
        return Outcome(0, summary=["Quit; nothing written."])
    return Outcome(EXIT_INTERRUPTED, summary=["Cancelled; nothing written."])


class WizardApp(App[Outcome]):
    CSS_PATH = "wizard.tcss"
    TITLE = "wizard"
    BINDINGS = [
        # Ctrl+Q is the Quit key: a choice, exit 0 ("Quit; nothing written."); Ctrl+C is the terminal's interrupt,
        # exit 130 as for a signal (README, exit codes)
        Binding("ctrl+q", "request_quit(True)", "Quit", priority=True),
        Binding("ctrl+c", "request_quit(False)", "Quit", show=False, priority=True),
    ]

    def __init__(self, request: pipeline.Request, *, hardware: Hardware | None = None,
                 preload: bool = True) -> None:
        super().__init__()
        self.state = WizardState(request, hardware)
        self.preload = preload
        self._preloaded = False
        self._preload_started = False
        self._sizing_timer = None
        self._validation_token = 0
        self._quitting = False
        self._quit_chosen = True
        self._stopping = False
        self.written_result: pipeline.Result | None = None
        self.writes: list = []

    # ------------------------------------------------------------------ type-ahead

    async def on_event(self, event: events.Event) -> None:
        """Drop an Enter typed before the current screen showed its result (see WizardScreen.result_pending):
        keys typed while a screen is built or sized must not fall through it."""
        if isinstance(event, events.Key) and event.key == "enter" and not event.is_forwarded:
            from wizard.frontends.tui.screens.base import WizardScreen
            screen = self.screen
            if isinstance(screen, WizardScreen) and not screen.accepts_enter_typed_at(event.time):
                screen.typed_ahead()
                return
        await super().on_event(event)

    # ------------------------------------------------------------------ start

    def on_mount(self) -> None:
        from wizard.frontends.tui.screens.hardware import HardwareScreen
        self._handle_stop_signals()
        self.push_screen(HardwareScreen())
        if self.state.probed is None:
            # After the first paint: the probe thread would otherwise compete for the GIL with it.
            self.call_after_refresh(self.probe_hardware)
        else:
            self.call_after_refresh(self._hardware_known)

    @work(thread=True, exit_on_error=False, group="probe")
    def probe_hardware(self) -> None:
        try:
            hw = self.state.load_hardware()
        except InputError as e:
            self.post_message(HardwareReady(None, str(e)))
        except Exception as e:  # the probe must never take the wizard down
            self.post_message(HardwareReady(None, f"probe failed: {type(e).__name__}: {e}"))
        else:
            self.post_message(HardwareReady(hw))

    def on_hardware_ready(self, message: HardwareReady) -> None:
        if message.hardware is None:
            self.state.error = message.error
            self.refresh_state()
            return
        self.state.set_probed(message.hardware)
        self._hardware_known()
        screen = self.screen
        if hasattr(screen, "ready_again"):
            self.call_after_refresh(screen.ready_again)

    def _hardware_known(self) -> None:
        self.replan()

    def start_preload(self) -> None:
        """Import accelerate/DeepSpeed/transformers while the user reads the plan, so Review
        validates fast. Started from the Plan screen: by then the model is sized, so the two
        heavy jobs don't queue behind each other."""
        if self.preload and not self._preload_started:
            self._preload_started = True
            self._preload_libraries()

    @work(thread=True, exit_on_error=False, group="preload")
    def _preload_libraries(self) -> None:
        with HEAVY_IMPORTS:
            try:
                from wizard.config import validate
                validate.preload()
            except Exception:   # importing third-party libraries can raise anything; validation,
                pass            # which imports them again, reports the real error when it runs
        self._preloaded = True

    # ------------------------------------------------------------------ answers, plan, sizing

    def answer(self, qid: str, value: Any) -> None:
        self.state.set_answer(qid, value)
        self.replan()

    def replan(self) -> None:
        job = self.state.replan()
        if job is not None:
            self.schedule_sizing(job)
        self.refresh_state()

    def refresh_state(self) -> None:
        screen = self.screen
        if hasattr(screen, "sync"):
            screen.post_message(StateChanged())

    def schedule_sizing(self, job) -> None:
        if self._sizing_timer is not None:
            self._sizing_timer.stop()
        self._sizing_timer = self.set_timer(SIZING_DEBOUNCE_S, lambda: self.size_in_thread(job))

    @work(thread=True, exclusive=True, exit_on_error=False, group="size")
    def size_in_thread(self, job) -> None:
        model_arg = job.model
        _test_sizing_delay()
        try:
            with HEAVY_IMPORTS:
                shape = pipeline.size_for_plan(model_arg, job.trainings)
        except InputError as e:
            self.post_message(ModelSized(model_arg, None, e))
        # Broad: sizing runs torch's and transformers' config and modeling code on the user's model, which
        # raise what they like; the screen shows it as a model error, and the worker must not die with it.
        except Exception as e:
            self.post_message(ModelSized(model_arg, None, InputError("model", f"cannot size it: {e}")))
        else:
            self.post_message(ModelSized(model_arg, shape, None))

    def on_model_sized(self, message: ModelSized) -> None:
        job = self.state.sized(message.model_arg, message.shape, message.error)
        if job is not None:
            self.schedule_sizing(job)
        self.refresh_state()
        screen = self.screen
        if hasattr(screen, "ready_again"):
            self.call_after_refresh(screen.ready_again)

    @property
    def sizing(self) -> bool:
        return self.state.sizing is not None

    # ------------------------------------------------------------------ validation

    def validate_in_thread(self, result: pipeline.Result) -> int:
        self._validation_token += 1
        self._validate(result, self._validation_token)
        return self._validation_token

    @work(thread=True, exclusive=True, exit_on_error=False, group="validate")
    def _validate(self, result: pipeline.Result, token: int) -> None:
        try:
            with HEAVY_IMPORTS:
                pipeline.validate(result)
        except Exception as e:      # the libraries' own checks raise anything; Review shows it, the worker lives
            self.post_message(ValidationDone(token, [], f"{type(e).__name__}: {e}"))
        else:
            self.post_message(ValidationDone(token, list(result.findings)))

    def on_validation_done(self, message: ValidationDone) -> None:
        for screen in self.screen_stack:
            if hasattr(screen, "validation_done"):
                screen.validation_done(message)

    # ------------------------------------------------------------------ navigation

    def screen_order(self) -> list[type]:
        from wizard.frontends.tui.screens.details import DetailsScreen
        from wizard.frontends.tui.screens.done import DoneScreen
        from wizard.frontends.tui.screens.hardware import HardwareScreen
        from wizard.frontends.tui.screens.model import ModelScreen
        from wizard.frontends.tui.screens.plan import PlanScreen
        from wizard.frontends.tui.screens.review import ReviewScreen
        return [HardwareScreen, ModelScreen, PlanScreen, DetailsScreen, ReviewScreen, DoneScreen]

    def advance(self, screen) -> None:
        order = self.screen_order()
        index = order.index(type(screen))
        if index + 1 < len(order):
            self.push_screen(order[index + 1]())

    def back(self) -> None:
        if len(self.screen_stack) > 2:
            self.pop_screen()

    def finish(self, outcome: Outcome) -> None:
        self.exit(outcome)

    # ------------------------------------------------------------------ quitting

    def action_request_quit(self, chosen: bool = True) -> None:
        """Ctrl+Q (`chosen`: the user's choice to stop, exit 0) or Ctrl+C (an interrupt, exit 130); once something
        was typed, "Quit the wizard?" asks first, and the key that opened it decides the code."""
        from wizard.frontends.tui.screens.modals import QuitModal
        if self._quitting:
            # ctrl+c / ctrl+q again while "Quit the wizard?" is open: that is the answer.
            self.exit(quit_outcome(self._quit_chosen))
            return
        if self.state.written:
            self.exit(Outcome(0, summary=self.summary_lines()))
            return
        if not self.state.changed:
            self.exit(quit_outcome(chosen))
            return

        def decided(quit_now: bool | None) -> None:
            self._quitting = False
            if quit_now:
                self.exit(quit_outcome(chosen))

        self._quitting, self._quit_chosen = True, chosen
        self.push_screen(QuitModal("You changed some answers. Nothing has been written yet; quitting "
                                   "leaves every existing file as it is."), decided)

    # ------------------------------------------------------------------ signals

    def _handle_stop_signals(self) -> None:
        """A closed terminal (SIGHUP), `kill` (SIGTERM) or SIGINT ends the app through Textual's own exit, which
        restores the terminal and ends its input and output threads. Python's handlers would raise
        KeyboardInterrupt inside the event loop instead: the loop dies, those threads live on, and the process
        never exits (spinning at full CPU once the terminal is gone)."""
        import asyncio
        import signal
        if threading.current_thread() is not threading.main_thread():
            return
        loop = asyncio.get_running_loop()
        for name in STOP_SIGNALS:
            try:
                loop.add_signal_handler(getattr(signal, name), self.stop_for_signal, name)
            except (ValueError, RuntimeError, NotImplementedError):   # not the main interpreter / no signals here
                return

    def stop_for_signal(self, name: str, files_written: bool | None = None) -> None:
        """End the app after a stop signal; `files_written` when the set write reported it (fsutil).

        Handlers run between the loop's callbacks, never inside a set write, so there is nothing to roll back.
        With the terminal gone (SIGHUP from a dropped SSH session) Textual's exit would block on its output
        thread, which died writing to it: leave at once. Otherwise exit through Textual, with a deadline."""
        if self._stopping:
            return                       # the write's own report came first; the loop's handler follows it
        self._stopping = True
        if not _terminal_alive():
            os._exit(EXIT_INTERRUPTED)
        _exit_after(STOP_DEADLINE_S)
        written = self.state.written if files_written is None else files_written
        summary = self.summary_lines() if self.state.written else []
        summary.append(f"Interrupted ({name}); {'the files were written' if written else 'nothing written'}.")
        self.exit(Outcome(EXIT_INTERRUPTED, summary=summary))

    def summary_lines(self, launching: bool = False) -> list[str]:
        """What stays in the terminal after the screen is gone: what was written, how to launch (unless
        `launching`: then `wizard launch` takes over the terminal and says how the run went)."""
        from wizard.frontends.snippets import launch_commands
        result = self.written_result
        if result is None:
            return []
        if self.state.request.dry_run:
            lines = ["Dry run: nothing written."]
        else:
            lines = []
            for w in self.writes:
                backup = f" (previous kept as {w.backup_path})" if w.backup_path else ""
                lines.append(f"{'Unchanged' if not w.changed else 'Wrote'} {w.path}{backup}")
        if result.plan.topology.cpu:
            lines.append(f"A CPU-only configuration: {result.plan.topology.world_size} CPU process(es), gloo, fp32.")
        if launching:
            return lines
        script = self.state.script or ["your_train.py"]      # the script measured, where Measure ran one
        accel, wiz = launch_commands(result.yaml_path, script[0], script[1:])
        from wizard.frontends.report import script_settings_lines
        lines += script_settings_lines(result)
        lines += [f"Next: {wiz}", f"  or: {accel}"]
        return lines


TEST_SIZING_DELAY_ENV = "WIZARD_TEST_SIZING_DELAY_S"


def _test_sizing_delay() -> None:
    """Tests only: WIZARD_TEST_SIZING_DELAY_S=N makes every sizing take N seconds more, as a large model on
    a slow disk does, so the type-ahead test can type during it. Unset in real use."""
    import os
    import time
    delay = os.environ.get(TEST_SIZING_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def make_app(request: pipeline.Request, *, hardware: Hardware | None = None, preload: bool = True) -> WizardApp:
    """The wizard for this request; `hardware` replaces --hardware/--assume/the probe (tests)."""
    return WizardApp(request, hardware=hardware, preload=preload)
