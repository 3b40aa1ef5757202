"""The Hugging Face reference: `tokenizers` from tokenizer.json and transformers on CPU.

The tokenizer has padding and truncation switched off (MiniLM's tokenizer.json pads to 128, so a
naive comparison would count pad tokens). Models run in float32, in eval mode, streamed from the
safetensors module by module (engine/runtime/streamed_model.py: memory bounded by the largest module,
not the model), or loaded whole when a source cannot be streamed bit for bit. Library errors are
translated into `ReferenceMissingError` here, at the boundary.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ReferenceMissingError, SourceError
from engine.formats.json_input import parse_json
from engine.resources import cpu_budget, limit_native_threads
from engine.runtime.activation_rounding import rounded_linear_inputs
from engine.runtime.checkpoints import Checkpoint
from engine.runtime.sentence_config import Pooling
from engine.runtime.streamed_model import STREAMED, streamed_model
from engine.versions import package_version


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

    def encode_pair(self, query: str, document: str) -> list[int]:
        """A (query, document) pair through the post-processor's pair template, as a cross-encoder reads it."""
        self.tokenizer.encode_special_tokens = True
        return list(self.tokenizer.encode(query, document, add_special_tokens=True).ids)

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        self.tokenizer.encode_special_tokens = not parse_special
        return list(self.tokenizer.encode(text, add_special_tokens=add_special).ids)

    def token_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)


# What building a reference imports: torch, transformers and the modules its model code and loader use. From a
# cold page cache ~9 s on 2 cores, so a verification imports them beside gate 1 (engine/warm_imports.py)
REFERENCE_LIBRARIES = ("torch", "transformers", "transformers.modeling_utils", "transformers.initialization",
                       "transformers.core_model_loading", "transformers.conversion_mapping",
                       "transformers.masking_utils", "transformers.models.auto.modeling_auto")


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ReferenceMissingError("torch is not installed") from exc
    return torch


def _size_thread_pools(torch: Any) -> None:
    """torch's intra-op pool, OpenMP and BLAS to the pod's CPU budget; the inter-op pool can only be
    sized before torch first uses it, so a later call leaves it as it is."""
    threads = cpu_budget()
    limit_native_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)


# The most padding a sequence may add to a batch: each padded position costs one position's compute through
# every layer, and each batch one more read of the weights. One read of a BF16 source costs what its float32
# compute of R/B positions costs (R FLOP/s of compute, B bytes/s of storage: at 7B on 2 cores ~180 GFLOP/s
# against 200-400 MB/s, 450-900 positions; less where the weights sit in the page cache). A sequence padded by
# at most this much is computed, not read again; a longer one starts its own batch.
PADDING_POSITIONS = 256


def length_groups(sequences: Sequence[list[int]]) -> list[list[list[int]]]:
    """Sequences longest first, cut into batches in which no sequence is padded by more than
    PADDING_POSITIONS. A long text beside short ones would otherwise pad every one of them to its length
    (the near-context-limit text of 2,031 tokens beside a 75-token one doubled the reference's compute for
    it), and a padding bound relative to the tokens split the short texts into three reads of the weights
    where padding them to the longest costs a few dozen positions. Each batch is one more read of a
    streamed model's weights, so texts of similar lengths share one."""
    groups: list[list[list[int]]] = []
    for sequence in sorted(sequences, key=len, reverse=True):
        if groups and len(groups[-1][0]) - len(sequence) <= PADDING_POSITIONS:
            groups[-1].append(sequence)
        else:
            groups.append([sequence])
    return groups


def packed_rows(group: Sequence[list[int]]) -> list[list[list[int]]]:
    """A length group's sequences (longest first) placed end to end in rows as wide as its longest one, each
    into the first row with room (first fit, longest first), so a causal model computes their tokens and at
    most the rows' slack instead of every sequence padded to the longest: 483 tokens of a llama's default
    texts are 1,350 positions padded, 525 packed."""
    width = max((len(sequence) for sequence in group), default=0)
    rows: list[list[list[int]]] = []
    room: list[int] = []
    for sequence in sorted(group, key=len, reverse=True):
        for row, free in enumerate(room):
            if len(sequence) <= free:
                rows[row].append(sequence)
                room[row] -= len(sequence)
                break
        else:
            rows.append([sequence])
            room.append(width - len(sequence))
    return rows


class HFModel:
    """transformers on CPU; the same object serves embeddings (base model), logits (causal LM) or
    relevance scores (a sequence-classification head, `classifier=True`). `streamed=False` loads the
    whole float32 model instead (the reference the streamed one is tested against). `checkpoint` is
    where the weights come from: the source's safetensors by default, or the artifact's own tensors
    (`ArtifactCheckpoint`) for gate 2's correctness reference."""

    def __init__(self, source_dir: Path, *, causal: bool, classifier: bool = False, streamed: bool = True,
                 checkpoint: Checkpoint | None = None) -> None:
        self.source_dir = source_dir
        self.causal = causal
        self.classifier = classifier
        self.streamed = streamed
        self.checkpoint = checkpoint
        # prefetch's outputs, each kept until taken as many times as it was asked for
        self._batched: dict[tuple[int, ...], np.ndarray] = {}
        self._takes: Counter[tuple[int, ...]] = Counter()

    @cached_property
    def model(self) -> Any:
        torch = _torch()
        try:
            from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification
        except ImportError as exc:
            raise ReferenceMissingError("transformers is not installed") from exc
        loader = AutoModelForSequenceClassification if self.classifier else (
            AutoModelForCausalLM if self.causal else AutoModel)
        _size_thread_pools(torch)
        try:
            model = streamed_model(loader, self.source_dir, checkpoint=self.checkpoint) if self.streamed else None
            if model is None and self.checkpoint is not None:
                model = loader.from_pretrained(self.source_dir, dtype=torch.float32,
                                               state_dict=self.checkpoint.read(self.checkpoint.names()))
            elif model is None:
                model = loader.from_pretrained(self.source_dir, dtype=torch.float32, use_safetensors=True)
        except ImportError as exc:
            raise ReferenceMissingError(f"transformers needs a package it cannot import: {exc}") from exc
        except Exception as exc:  # any failure to build the reference (unknown model type, shapes, remote code)
            raise SourceError("source.unsupported_architecture", self._cannot_build(exc)) from exc
        return model.eval()

    def _cannot_build(self, exc: Exception) -> str:
        config = parse_json((self.source_dir / "config.json").read_bytes(), "config.json")
        config = config if isinstance(config, dict) else {}
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return (f"transformers {package_version('transformers') or '(not installed)'} cannot build the source model "
                f"(architectures {config.get('architectures')}, model_type {config.get('model_type')!r}), "
                f"so gate 2 has no reference: {type(exc).__name__}: {first_line}")

    def prefetch(self, sequences: Sequence[list[int]]) -> None:
        """Run every sequence through the model in one batch per length group when its weights are streamed
        (packed for a causal LM, padded for an encoder), so each weight is read once for all of them instead of
        once per sequence (a 70B source does not fit a pod's
        page cache: 8 texts one by one would read it 8 times). The outputs wait for `embed` / `logits` to
        take them. A model whose weights stay resident gains nothing and keeps running one sequence at a
        time (exactly the numbers every threshold was measured with); a classifier head finds each
        sequence's last token by the pad id, which a config need not define, so it is never batched.

        Memory: the activations of every sequence at one layer, and their outputs (hidden states, or the
        head's logits: sequences x positions x vocabulary floats)."""
        if self.classifier or not getattr(self.model, STREAMED, False):
            return
        asked = Counter(tuple(ids) for ids in sequences if ids)
        todo = [list(ids) for ids in asked if ids not in self._batched]
        if len(todo) < 2:
            return
        self._takes.update(asked)
        for group in length_groups(todo):
            (self._run_packed if self.causal else self._run_padded)(group)

    def _run_padded(self, group: list[list[int]]) -> None:
        """One batch, each sequence right-padded to the longest (its positions stay 0..n-1) and masked: what
        an encoder gets, whose bidirectional attention transformers does not mask by packed positions."""
        torch = _torch()
        ids = torch.zeros((len(group), len(group[0])), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, sequence in enumerate(group):
            ids[row, :len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[row, :len(sequence)] = 1
        with torch.inference_mode():
            values = self._body(ids, mask)
        for row, sequence in enumerate(group):
            self._batched[tuple(sequence)] = values[row, :len(sequence)].numpy().copy()

    def _run_packed(self, group: list[list[int]]) -> None:
        """One batch of rows (`packed_rows`), every sequence with its own positions 0..n-1 and no attention
        mask: transformers then reads a position that does not follow its predecessor as the start of another
        sequence and masks attention between them (its packed-sequence format), sliding windows included.
        A row's slack is a filler sequence of its own, never read. No cache: the packed mask is built only
        without one, and a single forward has no use for it."""
        torch = _torch()
        rows = packed_rows(group)
        width = len(group[0])
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        positions = torch.zeros_like(ids)
        placed: list[tuple[list[int], int, int]] = []
        for row, packed in enumerate(rows):
            at = 0
            for sequence in packed:
                ids[row, at:at + len(sequence)] = torch.tensor(sequence, dtype=torch.long)
                positions[row, at:at + len(sequence)] = torch.arange(len(sequence))
                placed.append((sequence, row, at))
                at += len(sequence)
            positions[row, at:] = torch.arange(width - at)
        with torch.inference_mode():
            values = self.model.base_model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
        for sequence, row, at in placed:
            self._batched[tuple(sequence)] = values[row, at:at + len(sequence)].numpy().copy()

    def _take(self, ids: list[int]) -> np.ndarray | None:
        """A prefetched output, dropped once taken as often as it was asked for (a text may also be one
        of the retrieval set's)."""
        key = tuple(ids)
        found = self._batched.get(key)
        if found is not None:
            self._takes[key] -= 1
            if self._takes[key] <= 0:
                del self._batched[key], self._takes[key]
        return found

    def _forward(self, ids: list[int]) -> Any:
        torch = _torch()
        with torch.inference_mode():
            tensor = torch.tensor([ids], dtype=torch.long)
            return self.model(input_ids=tensor, attention_mask=torch.ones_like(tensor))

    def _body(self, ids: Any, mask: Any) -> Any:
        """The last hidden states of a batch: the base model's output (a causal LM's, before its head)."""
        body = self.model.base_model if self.causal else self.model
        return body(input_ids=ids, attention_mask=mask).last_hidden_state

    def rounding_pair(self, ids: list[int], dtype_name: str) -> tuple[np.ndarray, np.ndarray]:
        """A causal LM's last hidden states for `ids` twice, from one pass (one read of a streamed model's
        weights): exact, and with every matrix product's input rounded to `dtype_name` (`"float16"`,
        `"bfloat16"`), the second also rounded as the head's own input is (`activation_rounding.py`)."""
        torch = _torch()
        dtype = getattr(torch, dtype_name)
        tensor = torch.tensor([ids, ids], dtype=torch.long)
        with torch.inference_mode(), rounded_linear_inputs(self.model.base_model, dtype, row=1):
            found = self._body(tensor, torch.ones_like(tensor))
        return found[0].numpy().copy(), found[1].to(dtype).to(torch.float32).numpy().copy()

    def hidden(self, ids: list[int]) -> np.ndarray:
        """The last hidden states of one unpadded sequence, float32 [positions, hidden]: what the head reads.
        Positions x hidden floats, so a long text's are kept where its logits (x vocabulary) could not be."""
        found = self._take(ids)
        if found is None:
            torch = _torch()
            with torch.inference_mode():
                tensor = torch.tensor([ids], dtype=torch.long)
                found = self._body(tensor, torch.ones_like(tensor))[0].numpy().copy()
        return found

    def head(self, hidden: np.ndarray) -> np.ndarray:
        """A causal LM's logits for rows of its last hidden states, float32 [rows, vocabulary]: the model's own
        forward with its base model answering the given rows, so whatever the model does after the base (the
        head, a logit soft-cap, a scale) is applied as `from_pretrained`'s model applies it."""
        torch = _torch()
        rows = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))[None]
        body = self.model.base_model
        asked: list[bool] = []

        def given(*_args: Any, **_kwargs: Any) -> _BaseOutput:
            asked.append(True)
            return _BaseOutput(rows)

        body.forward = given  # this instance only, for this call: every module keeps its place in the model
        try:
            with torch.inference_mode():
                placeholder = torch.zeros((1, rows.shape[1]), dtype=torch.long)
                logits = self.model(input_ids=placeholder, attention_mask=torch.ones_like(placeholder)).logits
        finally:
            del body.forward
        if not asked:
            raise SourceError("source.unsupported_architecture", f"{type(self.model).__name__} does not compute its "
                              "logits from its base model's output: gate 2 cannot apply its head to given rows")
        return logits[0].numpy()

    def embed(self, ids: list[int], pooling: Pooling) -> np.ndarray:
        """Pooled, unnormalised sentence embedding of one unpadded sequence."""
        hidden = self._take(ids)
        if hidden is None:
            hidden = self._forward(ids).last_hidden_state[0].numpy()
        hidden = hidden.astype(np.float64)
        if pooling == "mean":
            return hidden.mean(axis=0)
        return hidden[0] if pooling == "cls" else hidden[-1]

    def logits(self, ids: list[int]) -> np.ndarray:
        """The head's logits: per position for a causal LM (its whole [positions, vocabulary] matrix: gate 2
        asks for rows through `hidden` and `head` instead), per sequence for a classifier (a reranker's
        relevance score)."""
        if self.classifier:
            return self._forward(ids).logits[0].double().numpy()
        return self.head(self.hidden(ids)).astype(np.float64)


class _BaseOutput:
    """The base model's output as the head's code reads it: the given rows as its last hidden state, and
    nothing for anything else a model's forward passes along (its cache, router logits, attentions)."""

    def __init__(self, rows: Any) -> None:
        self.last_hidden_state = rows

    def __getattr__(self, _name: str) -> None:
        return None

    def __getitem__(self, index: int) -> Any:
        if index != 0:
            raise IndexError(index)
        return self.last_hidden_state
