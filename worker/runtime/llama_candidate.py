"""The candidate: the GGUF as an outside user runs it, through llama-cpp-python.

`Llama.tokenize(text, add_bos=...)` passes that flag to llama.cpp as `add_special`, so
`add_bos=False` also drops an automatic EOS; `special` is `parse_special`. Load failures are
translated to `CandidateLoadError` here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from worker.errors import ConvgateError, ReferenceMissingError
from worker.resources import cpu_budget


class CandidateLoadError(ConvgateError):
    """llama.cpp could not load the GGUF."""


LLAMA_POOLING_RANK = 4  # enum llama_pooling_type: a classification head's score per sequence


@contextmanager
def _weights_from_the_map() -> Iterator[None]:
    """llama.cpp's CPU backend copies Q4_0/Q4_K/IQ4_NL weights into repacked anonymous buffers unless
    `use_extra_bufts` is off: a second copy of most of a 4-bit model that a pod cannot reclaim (+650 MiB
    at 1.7B Q4_K_M; ~35 GiB for a 70B). Off, every weight is read from the GGUF's map, so gate 2 stays
    within its bound. llama-cpp-python's `Llama()` takes no argument for it, so the params factory it
    calls is wrapped while the model loads, and restored."""
    import llama_cpp.llama as wrapper

    library = wrapper.llama_cpp
    default = library.llama_model_default_params

    def params() -> Any:
        chosen = default()
        chosen.use_extra_bufts = False
        return chosen

    library.llama_model_default_params = params
    try:
        yield
    finally:
        library.llama_model_default_params = default


class LlamaCandidate:
    def __init__(self, path: Path, *, embedding: bool, n_ctx: int, rank: bool = False) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ReferenceMissingError("llama-cpp-python is not installed") from exc
        pooling: dict[str, Any] = {"pooling_type": LLAMA_POOLING_RANK} if rank else {}
        threads = cpu_budget()  # llama-cpp-python's default is the host's CPU count, not the pod's limit
        try:
            with _weights_from_the_map():
                self.llm: Any = Llama(
                    str(path), embedding=embedding or rank, logits_all=not (embedding or rank), n_ctx=n_ctx,
                    n_batch=n_ctx, n_ubatch=n_ctx, verbose=False, n_threads=threads, n_threads_batch=threads,
                    **pooling,
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

    def pair_tokens(self, query: str, document: str) -> list[int]:
        """A (query, document) pair as llama-server's /rerank builds it without a rerank template:
        [BOS] query [EOS] [SEP] document [EOS], each special token only where the GGUF's flags add it."""
        import llama_cpp

        vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        eos = llama_cpp.llama_vocab_eos(vocab)
        eos = eos if eos != -1 else llama_cpp.llama_vocab_sep(vocab)
        add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
        out = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
        out += self.tokenize(query, add_special=False, parse_special=False) + ([eos] if add_eos else [])
        out += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
        return out + self.tokenize(document, add_special=False, parse_special=False) + ([eos] if add_eos else [])

    def rank_scores(self, tokens: list[int]) -> np.ndarray:
        """The classification head's outputs for one sequence (pooling RANK): n_cls_out floats."""
        import llama_cpp

        self.llm._batch.reset()
        self.llm._ctx.kv_cache_clear()
        self.llm._batch.add_sequence(tokens, 0, True)
        self.llm._ctx.decode(self.llm._batch)
        pointer = llama_cpp.llama_get_embeddings_seq(self.llm._ctx.ctx, 0)
        n_out = int(llama_cpp.llama_model_n_cls_out(self.llm.model))
        scores = np.array([pointer[i] for i in range(n_out)], dtype=np.float64)
        self.llm._batch.reset()
        self.llm._ctx.kv_cache_clear()
        return scores

    @property
    def n_embd(self) -> int:
        return int(self.llm.n_embd())
