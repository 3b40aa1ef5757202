"""The candidate: the GGUF as an outside user runs it, through llama-cpp-python.

`Llama.tokenize(text, add_bos=...)` passes that flag to llama.cpp as `add_special`, so
`add_bos=False` also drops an automatic EOS; `special` is `parse_special`. Load failures are
translated to `CandidateLoadError` here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import ConvgateError, ReferenceMissingError


class CandidateLoadError(ConvgateError):
    """llama.cpp could not load the GGUF."""


class LlamaCandidate:
    def __init__(self, path: Path, *, embedding: bool, n_ctx: int) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ReferenceMissingError("llama-cpp-python is not installed") from exc
        try:
            self.llm: Any = Llama(
                str(path), embedding=embedding, logits_all=not embedding, n_ctx=n_ctx, n_batch=n_ctx,
                n_ubatch=n_ctx, verbose=False, n_threads=None,
            )
        except (ValueError, RuntimeError) as exc:
            raise CandidateLoadError(f"llama.cpp cannot load {path.name}: {exc}") from exc

    def close(self) -> None:
        self.llm.close()

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special))

    def embed(self, text: str) -> np.ndarray:
        """Pooled, unnormalised embedding, tokenized by llama.cpp itself (add_special, no parsing)."""
        return np.asarray(self.llm.embed(text, normalize=False, truncate=False), dtype=np.float64)

    def logits(self, ids: list[int]) -> np.ndarray:
        self.llm.reset()
        self.llm.eval(ids)
        return np.asarray(self.llm.scores[: len(ids)], dtype=np.float64).copy()

    @property
    def n_embd(self) -> int:
        return int(self.llm.n_embd())
