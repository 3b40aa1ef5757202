"""Per-architecture facts for gate 1: name normalisation, intentional omissions, row transforms and
the metadata that must agree with config.json.

A registry of small classes, one per GGUF architecture, registered by class keyword. Transforms
are written out here explicitly (never inferred to make a comparison pass).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gguf
import numpy as np

from worker.gates.expectation import Expectation
from worker.gates.hyperparameters import common_hyperparameters


@dataclass(frozen=True, slots=True)
class RowTransform:
    """GGUF row i holds source row `order[i]`; `name` is how the report describes it."""

    name: str
    order: np.ndarray


def head_permutation(rows: int, n_head: int) -> np.ndarray:
    """Row order of llama.cpp's Q/K permutation (interleaved rotary halves -> per-head pairs)."""
    return np.arange(rows).reshape(n_head, 2, rows // n_head // 2).swapaxes(1, 2).reshape(-1)


class Architecture:
    """Base: subclasses register with `class X(Architecture, arch="name")`."""

    registry: ClassVar[dict[str, type[Architecture]]] = {}
    model_arch: ClassVar[gguf.MODEL_ARCH]
    arch: ClassVar[str]
    omitted_patterns: ClassVar[tuple[tuple[str, str], ...]] = ()
    hf_architectures: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, arch: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if arch in Architecture.registry:
            raise TypeError(f"architecture {arch!r} registered twice")
        cls.arch = arch
        Architecture.registry[arch] = cls

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config
        n_blocks = int(config.get("num_hidden_layers", 0))
        self.name_map = gguf.get_tensor_name_map(self.model_arch, n_blocks)

    def canonical_source_name(self, name: str) -> str:
        return name

    def omission_reason(self, source_name: str) -> str | None:
        """Why a source tensor is legitimately absent from the GGUF, or None if it must be there."""
        for pattern, reason in self.omitted_patterns:
            if re.fullmatch(pattern, source_name):
                return reason
        return None

    def gguf_name(self, source_name: str) -> str | None:
        return self.name_map.get_name(self.canonical_source_name(source_name), try_suffixes=(".weight", ".bias"))

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        return None

    def expectations(self) -> list[Expectation]:
        """Every architecture key llama.cpp reads that config.json determines."""
        out = [Expectation("general.architecture", self.arch, f"config.architectures {self.hf_architectures}")]
        if not set(self.config.get("architectures") or ()) & set(self.hf_architectures):
            out[0] = Expectation("general.architecture", f"one of {self.hf_architectures}",
                                 f"config.architectures {self.config.get('architectures')}")
        return out + common_hyperparameters(self.arch, self.config)


class Bert(Architecture, arch="bert"):
    model_arch = gguf.MODEL_ARCH.BERT
    omitted_patterns = (
        (r"(bert\.)?embeddings\.position_ids", "position ids buffer, not a weight"),
        (r"(bert\.)?pooler\.dense\.(weight|bias)", "pooler head is unused for embeddings (llama.cpp drops it)"),
        (r"cls\.(predictions|seq_relationship)\..*", "masked-LM / NSP heads are unused for embeddings"),
    )
    hf_architectures = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification")

    def expectations(self) -> list[Expectation]:
        return [*super().expectations(),
                Expectation("bert.attention.causal", False, "BERT encoders attend both ways", default=True)]

    def canonical_source_name(self, name: str) -> str:
        name = name.removeprefix("bert.")
        if name.endswith(".gamma"):
            return name[: -len(".gamma")] + ".weight"
        if name.endswith(".beta"):
            return name[: -len(".beta")] + ".bias"
        return name


class Llama(Architecture, arch="llama"):
    model_arch = gguf.MODEL_ARCH.LLAMA
    omitted_patterns = ((r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", "rotary buffer, recomputed"),)
    hf_architectures = ("LlamaForCausalLM", "LlamaModel")

    def expectations(self) -> list[Expectation]:
        out = super().expectations()
        heads = int(self.config["num_attention_heads"])
        rope_dim = int(self.config.get("head_dim") or int(self.config["hidden_size"]) // heads)
        out.append(Expectation("llama.rope.dimension_count", rope_dim, "config.head_dim (or hidden_size / heads)",
                               default=int(self.config["hidden_size"]) // heads))
        if "vocab_size" in self.config:
            out.append(Expectation("llama.vocab_size", int(self.config["vocab_size"]), "config.vocab_size",
                                   optional=True))
        return out

    def omission_reason(self, source_name: str) -> str | None:
        if source_name == "lm_head.weight" and self.config.get("tie_word_embeddings"):
            return "output head tied to token embeddings (tie_word_embeddings)"
        return super().omission_reason(source_name)

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        n_head = int(self.config["num_attention_heads"])
        n_kv = int(self.config.get("num_key_value_heads") or n_head)
        if gguf_name.endswith(".attn_q.weight"):
            return RowTransform(f"llama Q head permutation (n_head={n_head})", head_permutation(rows, n_head))
        if gguf_name.endswith(".attn_k.weight"):
            return RowTransform(f"llama K head permutation (n_head_kv={n_kv})", head_permutation(rows, n_kv))
        return None


class Qwen2(Llama, arch="qwen2"):
    """Qwen2 keeps HF's rotary layout: no Q/K permutation."""

    model_arch = gguf.MODEL_ARCH.QWEN2
    hf_architectures = ("Qwen2ForCausalLM", "Qwen2Model")

    def expectations(self) -> list[Expectation]:
        return Architecture.expectations(self)

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        return None


class Qwen3(Qwen2, arch="qwen3"):
    model_arch = gguf.MODEL_ARCH.QWEN3
    hf_architectures = ("Qwen3ForCausalLM", "Qwen3Model")


def architecture_for(arch: str, config: Mapping[str, Any]) -> Architecture | None:
    cls = Architecture.registry.get(arch)
    return cls(config) if cls else None
