"""wizard.paths gives the same locations as accelerate itself, for HF_HOME and for XDG_CACHE_HOME."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from wizard import paths


def _accelerate_default_config_file(env: dict[str, str]) -> str:
    # accelerate computes its paths at import, so ask a fresh interpreter
    code = "from accelerate.commands.config.config_args import default_yaml_config_file as f; print(f)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("variable", ["HF_HOME", "XDG_CACHE_HOME"])
def test_default_config_file_matches_accelerate(variable, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv(variable, str(tmp_path))
    assert paths.accelerate_default_config_file() == _accelerate_default_config_file(dict(os.environ))
    assert paths.accelerate_config_dir() == os.path.dirname(paths.accelerate_default_config_file())


def test_home_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", "~/hf")
    assert paths.hf_home() == str(tmp_path / "hf")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert paths.accelerate_config_dir() == str(tmp_path / ".cache" / "huggingface" / "accelerate")
