"""GGUF tensors a converter computes from config.json rather than copies from a weight: their expected values,
derived independently of the converter, and gate 1's comparison with what the file holds.

Why: Llama 3.1 and 3.2 (and every llama with `rope_type: llama3`) ship `rope_freqs.weight`, the factor by
which llama.cpp divides each rotary frequency. Without it, llama.cpp rotates with the unscaled frequencies
and the model degrades with length (llama.cpp PR #8676); with a wrong one, the same. It has no source tensor:
transformers recomputes its rotary frequencies from the config. Unknown to gate 1, every honest Llama 3.1
conversion was NO-GO (`tensor.unexpected`); a file missing it was not told apart from one holding it.

Expected values come from transformers' own rope initialisation (`ROPE_INIT_FUNCTIONS`): the unscaled
inverse frequencies over the scaled ones, which is what llama.cpp divides by. The converter computes the
same factors with its own float32 arithmetic, so the comparison is held to a relative bound, not bits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.blockers import Blocker
from engine.formats.artifact_files import ArtifactBytes
from engine.formats.gguf_structure import TensorInfo
from engine.report import TensorRow

RELATIVE_BOUND = 1e-5  # float32 arithmetic in the converter against float64 here: a few ulps apart


@dataclass(frozen=True)
class ComputedTensor:
    """A GGUF tensor's expected values computed from the config (a `TensorSource` with nothing to read)."""

    name: str  # what the report names as its source
    values: np.ndarray  # float64

    @property
    def dtype(self) -> str:
        return "F32"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    def as_rows(self) -> np.ndarray:
        return self.values.reshape(-1, self.values.shape[-1] if self.values.ndim else 1)

    def widen(self, chunk: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(chunk, dtype=np.float32)


def _rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    found = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(found, Mapping) and isinstance(found.get("full_attention"), Mapping):
        return found["full_attention"]
    return found if isinstance(found, Mapping) else {}


def llama3_rope_factors(config: Mapping[str, Any]) -> ComputedTensor | None:
    """`rope_freqs.weight` for a config with Llama 3 rope scaling, or None when it declares none."""
    parameters = _rope_parameters(config)
    if str(parameters.get("rope_type", parameters.get("type", ""))).lower() != "llama3":
        return None
    import torch
    from transformers import AutoConfig, PretrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    settings = {key: value for key, value in config.items() if key != "model_type"}
    model_config: PretrainedConfig = AutoConfig.for_model(str(config.get("model_type", "llama")), **settings)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](model_config, torch.device("cpu"))
    head_dim = getattr(model_config, "head_dim", None) or model_config.hidden_size // model_config.num_attention_heads
    base = float(parameters.get("rope_theta", getattr(model_config, "rope_theta", 10000.0)))
    unscaled = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factors = unscaled / scaled.double().numpy()
    return ComputedTensor(f"config.json rope_parameters (llama3, factor {parameters.get('factor')})", factors)


def check_computed(file_bytes: ArtifactBytes, info: TensorInfo, expected: ComputedTensor) -> tuple[TensorRow,
                                                                                                    list[Blocker]]:
    """The stored values against the computed ones, within RELATIVE_BOUND each."""
    raw = np.asarray(file_bytes[info.offset:info.offset + info.nbytes])
    found: list[Blocker] = []
    if info.ggml_type.name != "F32":
        found.append(Blocker(code="tensor.value_mismatch", gate="storage", tensor=info.name,
                             why=f"{info.name} is stored as {info.ggml_type.name}; the converter writes it as F32"))
        stored = np.full(expected.values.shape, np.nan)
    else:
        stored = raw.view("<f4").astype(np.float64).reshape(expected.values.shape)
    wanted = expected.values
    finite = np.isfinite(stored)
    error = np.abs(stored - wanted)
    over = int((~finite | (error > RELATIVE_BOUND * np.abs(wanted))).sum())
    if over and not found:
        found.append(Blocker(code="tensor.value_mismatch", gate="storage", tensor=info.name,
                             why=f"{over} of {wanted.size} values differ from {expected.name} by more than "
                                 f"{RELATIVE_BOUND:g} relative"))
    max_abs = float(error[finite].max()) if finite.any() else float("inf")
    norm = float(np.linalg.norm(wanted))
    row = TensorRow(
        gguf_name=info.name, source_names=[expected.name], transform=None, gguf_type=info.ggml_type.name,
        source_dtype=expected.dtype, shape=list(info.numpy_shape), check="bounded", max_abs=max_abs,
        rel_l2=float(np.linalg.norm(np.where(finite, stored - wanted, 0.0)) / norm) if norm else 0.0,
        mismatched=over, not_finite=int((~finite).sum()),
        bound=f"computed from the config: |stored - expected| <= {RELATIVE_BOUND:g} x |expected|",
        bound_violations=over, data_sha256=hashlib.sha256(raw.data).hexdigest(),
        result="fail" if found else "ok",
    )
    return row, found
