"""A DeepSpeed whose config models lack some keys, for the rules that tell a key newer than the installed
DeepSpeed: the installed models with those fields taken out (wizard.check.rules.deepspeed_json.ds_schema
patched), as a release before the key would read. Used only where no real older DeepSpeed is at hand; the
version table's claims themselves were read in each release's sdist (deepspeed_json.KEY_INTRODUCED).
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def deepspeed_lacking(*paths: str, version: str) -> Iterator[None]:
    """Within the block, the rules see a DeepSpeed `version` whose models lack each dotted key of `paths` (a
    top-level key: DeepSpeedConfig does not read it at all)."""
    from wizard.check.rules import deepspeed_json as dj

    real = dj.ds_schema()
    top = set(real.top_level)
    sections = dict(real.sections)
    for path in paths:
        parent, _, leaf = path.rpartition(".")
        for sub in [p for p in sections if p == path or p.startswith(path + ".")]:
            del sections[sub]
        if not parent:
            top.discard(leaf)
            continue
        model = sections[parent]
        name = dj.field_keys(model)[leaf]
        # a stand-in with the model's name, config and every other field: all the rules read of a model
        sections[parent] = type(model.__name__, (), {
            "model_fields": {n: f for n, f in model.model_fields.items() if n != name},
            "model_config": model.model_config})
    simulated = dj.DsSchema(version, frozenset(top), sections, dict(real.prefixes))
    saved = dj.ds_schema
    dj.ds_schema = lambda: simulated
    try:
        yield
    finally:
        dj.ds_schema = saved
