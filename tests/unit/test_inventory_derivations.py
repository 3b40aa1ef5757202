"""Inventory with derived tensors: stacked experts, a row slice and changed values are paired,
compared and classified; a derivation whose sources or target are wrong is a blocker, never a crash."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import ClassVar

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from worker.formats.ggml_types import GGML_TYPES_BY_NAME
from worker.formats.gguf_structure import GGUFLayout, TensorInfo
from worker.formats.source import open_source
from worker.gates.architectures import Architecture, Derivation
from worker.gates.architectures.derived import row_slice, stacked, value_map
from worker.gates.inventory import take_inventory
from worker.gates.tensor_values import check_tensor
from worker.policy import Policy

F32 = GGML_TYPES_BY_NAME["F32"]
RNG = np.random.default_rng(7)
EXPERTS = [RNG.standard_normal((4, 8)).astype(np.float32) for _ in range(3)]
POSITIONS = RNG.standard_normal((6, 8)).astype(np.float32)
NORM = RNG.standard_normal(8).astype(np.float32)


class _Derived(Architecture, arch="test-derived"):
    """Three derivations and nothing mapped one to one."""

    model_arch = gguf.MODEL_ARCH.LLAMA
    plan: ClassVar[list[Derivation]] = []

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        return list(self.plan)


def _layout(stored: dict[str, np.ndarray]) -> tuple[GGUFLayout, np.ndarray]:
    infos, blob, offset = [], b"", 0
    for name, values in stored.items():
        raw = np.ascontiguousarray(values, dtype=np.float32).tobytes()
        infos.append(TensorInfo(name, tuple(reversed(values.shape)), F32, offset, len(raw)))
        blob, offset = blob + raw, offset + len(raw)
    layout = GGUFLayout(Path("x.gguf"), 3, 32, {}, tuple(infos), 0, len(blob))
    return layout, np.frombuffer(blob, dtype=np.uint8)


@pytest.fixture
def source(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test", "num_hidden_layers": 1}))
    tensors = {f"experts.{i}.w": e for i, e in enumerate(EXPERTS)} | {"pos": POSITIONS, "norm": NORM}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return open_source(tmp_path)


def _plan(*derivations: Derivation) -> _Derived:
    _Derived.plan = list(derivations)
    return _Derived({"num_hidden_layers": 1})


HONEST_PLAN = (
    stacked("blk.0.ffn_down_exps.weight", [f"experts.{i}.w" for i in range(3)], "experts stacked"),
    row_slice("position_embd.weight", "pos", slice(2, None), "padding offset of 2 rows dropped"),
    value_map("blk.0.norm.weight", "norm", "stored as 1 + w", lambda w: w + np.float32(1)),
)


def _honest() -> dict[str, np.ndarray]:
    return {"blk.0.ffn_down_exps.weight": np.stack(EXPERTS), "position_embd.weight": POSITIONS[2:],
            "blk.0.norm.weight": NORM + np.float32(1)}


def _check_all(stored: dict[str, np.ndarray], source) -> tuple[list[str], dict[str, str], list]:
    layout, file_bytes = _layout(stored)
    inventory = take_inventory(_plan(*HONEST_PLAN), layout, source)
    failed = []
    for pair in inventory.pairs:
        _, blockers = check_tensor(file_bytes, layout.tensor(pair.gguf_name), pair.source, pair.transform, Policy())
        failed += [b.tensor for b in blockers]
    return failed, inventory.classification, list(inventory.blockers)


def test_honest_derived_tensors_are_bit_exact_and_classified(source):
    failed, classification, blockers = _check_all(_honest(), source)
    assert failed == [] and blockers == []
    assert classification["experts.1.w"] == "transformed (experts stacked) into blk.0.ffn_down_exps.weight"
    assert classification["pos"].startswith("transformed (padding offset")
    assert classification["norm"] == "transformed (stored as 1 + w) into blk.0.norm.weight"


@pytest.mark.parametrize(("tensor", "defect"), [
    ("blk.0.ffn_down_exps.weight", lambda t: t[[0, 2, 1]]),  # two experts swapped
    ("blk.0.ffn_down_exps.weight", lambda t: np.where(np.arange(t.size).reshape(t.shape) == 70, t * 2, t)),
    ("position_embd.weight", lambda t: POSITIONS[1:5]),  # sliced at the wrong offset
    ("blk.0.norm.weight", lambda t: NORM),  # the +1 not applied
])
def test_a_defect_in_a_derived_tensor_names_it(source, tensor, defect):
    stored = _honest()
    stored[tensor] = defect(stored[tensor])
    failed, _, blockers = _check_all(stored, source)
    assert failed == [tensor] and blockers == []


def test_a_missing_source_or_target_or_wrong_shape_is_a_blocker(source):
    layout, _ = _layout({"blk.0.ffn_down_exps.weight": np.stack(EXPERTS[:2]),
                         "position_embd.weight": POSITIONS})
    arch = _plan(
        stacked("blk.0.ffn_down_exps.weight", ["experts.0.w", "experts.1.w", "experts.2.w"], "experts stacked"),
        stacked("blk.0.ffn_up_exps.weight", ["experts.0.w", "experts.9.w"], "experts stacked"),
        row_slice("position_embd.weight", "pos", slice(2, None), "padding offset dropped"),
        value_map("blk.0.norm.weight", "norm", "stored as 1 + w", lambda w: w + 1),
    )
    inventory = take_inventory(arch, layout, source)
    found = sorted((b.code, b.tensor) for b in inventory.blockers)
    assert found == [("tensor.missing", "blk.0.ffn_up_exps.weight"), ("tensor.missing", "blk.0.norm.weight"),
                     ("tensor.shape_mismatch", "blk.0.ffn_down_exps.weight"),
                     ("tensor.shape_mismatch", "position_embd.weight")]
    assert inventory.pairs == ()
