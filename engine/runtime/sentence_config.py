"""What a sentence-transformers model directory says about pooling, normalisation and prompts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from engine.formats.source import SourceModel

Pooling = Literal["mean", "cls", "last"]
# llama.cpp pooling type (gguf.PoolingType) of each pooling mode
LLAMA_POOLING: dict[Pooling, int] = {"mean": 1, "cls": 2, "last": 3}
_MODE_FLAGS: dict[str, Pooling] = {
    "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls", "pooling_mode_lasttoken": "last",
}
_MODE_NAMES: dict[str, Pooling] = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


@dataclass(frozen=True, slots=True)
class SentenceConfig:
    pooling: Pooling | None
    normalize: bool
    prompts: dict[str, str] = field(default_factory=dict)

    @property
    def is_embedding_model(self) -> bool:
        return self.pooling is not None


def sentence_config(source: SourceModel) -> SentenceConfig:
    """Pooling from modules.json -> <path>/config.json, Normalize module, prompts; None when absent."""
    pooling: Pooling | None = None
    normalize = False
    for module in source.read_json("modules.json") or []:
        kind = str(module.get("type", ""))
        if kind.endswith("Pooling"):
            config = source.read_json(f"{module.get('path', '')}/config.json") or {}
            pooling = next((mode for flag, mode in _MODE_FLAGS.items() if config.get(flag)), None)
            pooling = pooling or _MODE_NAMES.get(str(config.get("pooling_mode")))
        elif kind.endswith("Normalize"):
            normalize = True
    prompts = (source.read_json("config_sentence_transformers.json") or {}).get("prompts") or {}
    return SentenceConfig(pooling, normalize, {str(k): str(v) for k, v in prompts.items()})
