"""Model sizing: exact parameter counts from a config, built on the meta device (no weights)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class ModelShape:
    params: int                           # exact; tied embeddings counted once
    largest_layer_params: int             # max over modules of params owned directly (DeepSpeed's definition)
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    vocab_size: int
    intermediate_size: int
    layer_class: str | None = None        # decoder layer class, for FSDP transformer wrapping
    model_type: str | None = None
    tied_embeddings: bool = False
    source: str = ""                      # path / hub id / "--params 7B"
    exact: bool = True                    # False when estimated from --params

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def size_model(id_or_path: str) -> ModelShape:
    """Local dir with config.json, a config.json path, or a Hub id in the local HF cache (offline)."""
    raise NotImplementedError


def from_params(params: int, hidden_size: int | None = None, layers: int | None = None,
                heads: int | None = None, vocab_size: int | None = None) -> ModelShape:
    """A Llama-like shape for `--params 7B` with optional shape overrides (exact=False)."""
    raise NotImplementedError
