"""launch._reaper.reap in-process: what it skips and what it ends (the end-to-end case is in
functional/test_launch_trust.py, marked slow)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from launch._reaper import reap

IGNORES_SIGTERM = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"


def test_reap_skips_odd_and_gone_entries_and_still_kills_the_tracked_process():
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM], stdout=subprocess.PIPE)
    try:
        stubborn.stdout.readline()                  # SIGTERM is ignored from here on
        created = psutil.Process(stubborn.pid).create_time()
        gone = subprocess.Popen(["true"])
        gone.wait()
        started = time.monotonic()
        # a negative pid (psutil: ValueError), a pid that is gone (NoSuchProcess), pid 1 with another
        # create time (a recycled pid: never hit), then the real one
        reap({-5: 1.0, gone.pid: 1.0, 1: 0.0, stubborn.pid: created}, grace=0.5)
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.5    # SIGTERM first, SIGKILL after the grace
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
