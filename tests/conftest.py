"""Shared by every test: no test reads the calibration `wizard tune` left on this machine."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_user_calibration(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("WIZARD_CALIBRATION_FILE", str(tmp_path_factory.mktemp("calibration") / "calibration.json"))
