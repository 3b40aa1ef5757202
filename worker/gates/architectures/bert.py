"""BERT-family encoders (GGUF architecture `bert`)."""

from __future__ import annotations

import gguf

from worker.gates.architectures.base import Architecture
from worker.gates.expectation import Expectation


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
