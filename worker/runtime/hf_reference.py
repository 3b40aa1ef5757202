"""The Hugging Face reference: `tokenizers` from tokenizer.json and transformers on CPU.

The tokenizer has padding and truncation switched off (MiniLM's tokenizer.json pads to 128, so a
naive comparison would count pad tokens). Models are loaded once, in float32, in eval mode.
Library errors are translated into `ReferenceMissingError` here, at the boundary.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import ReferenceMissingError, SourceError
from worker.formats.json_input import parse_json
from worker.runtime.sentence_config import Pooling


class HFTokenizer:
    def __init__(self, tokenizer_json: Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ReferenceMissingError("the `tokenizers` package is not installed") from exc
        if not tokenizer_json.is_file():
            raise ReferenceMissingError(f"the source has no {tokenizer_json.name}")
        raw = parse_json(tokenizer_json.read_bytes(), tokenizer_json.name)
        if not isinstance(raw, dict):
            raise SourceError("source.bad_file", f"{tokenizer_json.name} is not a JSON object")
        self.raw: dict[str, Any] = raw
        try:
            self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # the Rust library raises a bare Exception for any malformed file
            raise SourceError("source.bad_file", f"`tokenizers` refuses {tokenizer_json.name}: {exc}") from exc
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.tokenizer.encode_special_tokens = not parse_special
        return list(self.tokenizer.encode(text, add_special_tokens=add_special).ids)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ReferenceMissingError("torch is not installed") from exc
    return torch


class HFModel:
    """transformers on CPU; the same object serves embeddings (base model) or logits (causal LM)."""

    def __init__(self, source_dir: Path, *, causal: bool) -> None:
        self.source_dir = source_dir
        self.causal = causal

    @cached_property
    def model(self) -> Any:
        torch = _torch()
        try:
            from transformers import AutoModel, AutoModelForCausalLM
        except ImportError as exc:
            raise ReferenceMissingError("transformers is not installed") from exc
        loader = AutoModelForCausalLM if self.causal else AutoModel
        torch.set_num_threads(max(torch.get_num_threads(), 1))
        try:
            model = loader.from_pretrained(self.source_dir, dtype=torch.float32, use_safetensors=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ReferenceMissingError(f"transformers cannot load the source: {exc}") from exc
        return model.eval()

    def _forward(self, ids: list[int]) -> Any:
        torch = _torch()
        with torch.inference_mode():
            tensor = torch.tensor([ids], dtype=torch.long)
            return self.model(input_ids=tensor, attention_mask=torch.ones_like(tensor))

    def embed(self, ids: list[int], pooling: Pooling) -> np.ndarray:
        """Pooled, unnormalised sentence embedding of one unpadded sequence."""
        hidden = self._forward(ids).last_hidden_state[0].double().numpy()
        if pooling == "mean":
            return hidden.mean(axis=0)
        return hidden[0] if pooling == "cls" else hidden[-1]

    def logits(self, ids: list[int]) -> np.ndarray:
        return self._forward(ids).logits[0].double().numpy()
