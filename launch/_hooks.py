"""Run a callback right after a module is first imported: how the rank-side helpers (the tune probe in _probe.py,
the checkpoint recorder and resume in _checkpoints.py) reach torch, transformers and accelerate without editing the
user's script and without importing them early (a script that sets CUDA_VISIBLE_DEVICES or threads before its own
`import torch` keeps working).

Loaded by launch/_worker.py's helpers as a top-level module (the worker's sys.path[0] is launch/). One finder on
sys.meta_path serves every helper; several callbacks may wait on the same module, in the order registered.
"""

from __future__ import annotations

import sys


class AfterImport:
    """A meta path finder that runs each callback(module) registered for a name right after it is first imported."""

    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks:
            return None
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            for callback in self.callbacks.pop(name, []):
                run(callback, module, name)

        spec.loader.exec_module = exec_module
        return spec


def run(callback, module, name: str) -> None:
    try:
        callback(module)
    except Exception as exc:  # a helper must never break the user's script
        print(f"wizard: could not hook {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


_FINDER: AfterImport | None = None


def when_imported(name: str, callback) -> None:
    """callback(module) once `name` is imported: now if it already is, else right after its first import."""
    global _FINDER
    if name in sys.modules:
        run(callback, sys.modules[name], name)
        return
    if _FINDER is None:
        _FINDER = AfterImport()
        sys.meta_path.insert(0, _FINDER)
    _FINDER.callbacks.setdefault(name, []).append(callback)
