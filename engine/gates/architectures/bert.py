"""BERT-family encoders (GGUF architecture `bert`): BERT itself, RoBERTa and XLM-RoBERTa.

llama.cpp converts all three as `bert`. RoBERTa counts positions from `pad_token_id + 1`, so its
converter (`RobertaModel` / `XLMRobertaModel` in convert_hf_to_gguf) stores only the position
embedding rows from there on and lowers `context_length` by the same offset: both are stated here
as a row slice and an expectation, and undone explicitly. A sequence-classification head
(`classifier.dense` / `classifier.out_proj`, or BERT's single `classifier`) is stored as `cls` /
`cls.output` with the label names under `bert.classifier.output_labels`.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import gguf

from engine.gates.architectures.base import Architecture
from engine.gates.architectures.derived import Derivation, row_slice
from engine.gates.expectation import Expectation

# config.architectures for which the converter slices position embeddings past the padding offset
ROBERTA_CLASSES = frozenset({"RobertaModel", "RobertaForSequenceClassification",
                             "XLMRobertaModel", "XLMRobertaForSequenceClassification"})
POSITIONS = "embeddings.position_embeddings.weight"


def output_labels(config: dict[str, Any]) -> list[str] | None:
    """Label names the converter writes for a classification head (None: AutoConfig's two dummy labels)."""
    labels = config.get("id2label")
    if not isinstance(labels, dict) or not labels:
        return None
    if len(labels) == 2 and labels.get("0", labels.get(0)) == "LABEL_0":
        return None
    return [str(v) for _, v in sorted(labels.items(), key=lambda item: str(item[0]))]


class Bert(Architecture, arch="bert"):
    model_arch = gguf.MODEL_ARCH.BERT
    omitted_patterns = (
        (r"(bert\.)?embeddings\.position_ids", "position ids buffer, not a weight"),
        (r"(roberta\.)?embeddings\.(position_ids|token_type_ids)", "position / token type ids buffer, not a weight"),
        (r"(bert\.|roberta\.)?pooler\.dense\.(weight|bias)",
         "pooler head is unused for embeddings (llama.cpp drops it)"),
        (r"cls\.(predictions|seq_relationship)\..*", "masked-LM / NSP heads are unused for embeddings"),
    )
    hf_architectures = ("BertModel", "BertForMaskedLM", "BertForSequenceClassification", *sorted(ROBERTA_CLASSES))

    @property
    def position_offset(self) -> int | None:
        """Rows the converter drops from the position embeddings (RoBERTa's padding offset), if any."""
        roberta = set(self.config.get("architectures") or ()) & ROBERTA_CLASSES
        pad = self.config.get("pad_token_id")
        return int(pad) + 1 if roberta and isinstance(pad, int) else None

    def expectations(self) -> list[Expectation]:
        out = [*super().expectations(),
               Expectation("bert.attention.causal", False, "BERT encoders attend both ways", default=True)]
        if (offset := self.position_offset) is not None and "max_position_embeddings" in self.config:
            origin = f"config.max_position_embeddings minus the padding offset (pad_token_id + 1 = {offset})"
            out = [e for e in out if e.key != "bert.context_length"]
            out.append(Expectation("bert.context_length", int(self.config["max_position_embeddings"]) - offset, origin))
        if (labels := output_labels(dict(self.config))) is not None:
            out.append(Expectation("bert.classifier.output_labels", labels, "config.id2label"))
        return out

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        offset = self.position_offset
        name = next((n for n in (POSITIONS, f"roberta.{POSITIONS}") if n in source_names), None)
        if offset is None or name is None:
            return []
        return [row_slice("position_embd.weight", name, slice(offset, None),
                          f"RoBERTa position rows [{offset}:], from pad_token_id + 1 on")]

    def canonical_source_name(self, name: str) -> str:
        name = name.removeprefix("bert.").removeprefix("roberta.")
        if name.endswith(".gamma"):
            return name[: -len(".gamma")] + ".weight"
        if name.endswith(".beta"):
            return name[: -len(".beta")] + ".bias"
        if output_labels(dict(self.config)) is not None and name in ("classifier.weight", "classifier.bias"):
            return "classifier.out_proj." + name.rsplit(".", 1)[1]  # BERT's single projection is the output
        return name
