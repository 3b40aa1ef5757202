"""Gemma 2 and Gemma 3 decoders: RMSNorm weights stored as `1 + w`.

Gemma's RMSNorm multiplies by `1 + weight`; llama.cpp's multiplies by the stored weight, so the
converter adds 1 to every tensor whose name ends in `norm.weight` (input, post-attention,
pre/post-feedforward, final norm and, in Gemma 3, the q/k norms). It adds 1 in the dtype it holds:
float32 for F32 and BF16 sources (it widens BF16 first), float16 for F16 sources, and the 1-D
result is stored as F32. The derivation states and applies exactly that; no Q/K permutation.
`lm_head` is never converted (the embeddings are tied).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import gguf
import numpy as np

from engine.formats.source import SourceTensor
from engine.gates.architectures.base import Architecture
from engine.gates.architectures.derived import Derivation, DerivedTensor
from engine.gates.expectation import Expectation

NORM_OFFSET = "stored as 1 + w (Gemma RMSNorm)"


def _plus_one_in(dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """`w + 1` rounded as the converter's torch arithmetic rounds it for a source of `dtype`."""
    if dtype == "F16":
        return lambda w: (w.astype(np.float16) + np.float16(1)).astype(np.float32)
    return lambda w: w + np.float32(1)


def norm_offset(gguf_name: str, source_name: str) -> Derivation:
    def build(parts: Sequence[SourceTensor]) -> DerivedTensor:
        (part,) = parts
        # float32 (stored - 1) is exact for the norms' stored range, so the reference's own 1 + w gives back
        # exactly the multiplier llama.cpp reads
        return DerivedTensor(part.name, (part,), part.shape, values=_plus_one_in(part.dtype),
                             inverse=lambda stored: stored - np.float32(1))

    return Derivation(gguf_name, (source_name,), NORM_OFFSET, build)


class Gemma2(Architecture, arch="gemma2"):
    model_arch = gguf.MODEL_ARCH.GEMMA2
    hf_architectures = ("Gemma2ForCausalLM", "Gemma2Model")
    omitted_patterns = ((r"lm_head\.weight", "Gemma ties the output head to the token embeddings; the "
                                             "converter skips lm_head"),)

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        out = []
        for name in sorted(source_names):
            if name.endswith("norm.weight") and (target := self.gguf_name(name)) is not None:
                out.append(norm_offset(target, name))
        return out

    def expectations(self) -> list[Expectation]:
        out = super().expectations()
        for key, field in (("attn_logit_softcapping", "attn_logit_softcapping"),
                           ("final_logit_softcapping", "final_logit_softcapping")):
            if self.config.get(field) is not None:
                out.append(Expectation(f"{self.arch}.{key}", float(self.config[field]), f"config.{field}",
                                       is_float=True))
        if self.config.get("sliding_window") is not None:
            out.append(Expectation(f"{self.arch}.attention.sliding_window", int(self.config["sliding_window"]),
                                   "config.sliding_window"))
        return out


class Gemma3(Gemma2, arch="gemma3"):
    """As gemma2; its sliding-window layers' rope base (`rope.freq_base_swa`) is a common hyperparameter."""

    model_arch = gguf.MODEL_ARCH.GEMMA3
    hf_architectures = ("Gemma3ForCausalLM", "Gemma3TextModel")
