"""The interactive wizard (Textual). Importing this package imports nothing heavy: `run_tui` loads
the app when it is called, so `wizard --help` stays fast and free of Textual."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from wizard.pipeline import Request


def run_tui(request: "Request") -> int:
    """Run the full-screen wizard; return the exit code, or exec into `wizard launch` when asked."""
    from wizard.errors import EXIT_INTERRUPTED
    from wizard.frontends.tui.app import make_app

    app = make_app(request)
    try:
        outcome = app.run()
    except KeyboardInterrupt:
        print("Cancelled; nothing written.", file=sys.stderr)
        return EXIT_INTERRUPTED
    if outcome is None:
        # The app ended without an outcome: it crashed (Textual printed the traceback) or was killed.
        code = app.return_code if app.return_code not in (None, 0) else 1
        print("wizard: the interactive wizard stopped unexpectedly; existing files are untouched",
              file=sys.stderr)
        return code
    for line in outcome.summary:
        print(line, file=sys.stderr if outcome.code else sys.stdout)
    if outcome.launch:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp(outcome.launch[0], outcome.launch)
    return outcome.code
