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

from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import GGUFLayout, TensorInfo
from engine.formats.source import open_source
from engine.gates.architectures import Architecture, Derivation, RowTransform
from engine.gates.architectures.derived import DerivedTensor, row_slice, stacked, value_map
from engine.gates.inventory import take_inventory
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy

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
    value_map("blk.0.norm.weight", "norm", "stored as 1 + w", lambda w: w + np.float32(1), lambda v: v - np.float32(1)),
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
        value_map("blk.0.norm.weight", "norm", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1),
    )
    inventory = take_inventory(arch, layout, source)
    found = sorted((b.code, b.tensor) for b in inventory.blockers)
    assert found == [("tensor.missing", "blk.0.ffn_up_exps.weight"), ("tensor.missing", "blk.0.norm.weight"),
                     ("tensor.shape_mismatch", "blk.0.ffn_down_exps.weight"),
                     ("tensor.shape_mismatch", "position_embd.weight")]
    assert inventory.pairs == ()


class _OneToOne(Architecture, arch="test-one-to-one"):
    """Names mapped from a table, one omission, one row reorder and one derivation offered by name."""

    model_arch = gguf.MODEL_ARCH.LLAMA
    omitted_patterns = (("o\\.rotary", "computed at load"),)
    names: ClassVar[dict[str, str]] = {
        "a.weight": "t.a", "b.weight": "t.b", "c.weight": "t.c", "d.weight": "t.d", "e.weight": "t.e",
        "f.weight": "t.f", "g.weight": "t.absent", "i.int": "t.i", "k.weight": "t.a", "v.weight": "t.v",
        "w.weight": "t.v"}
    reorders: ClassVar[list[tuple[str, int]]] = []

    def gguf_name(self, source_name: str) -> str | None:
        return self.names.get(source_name)

    def transform(self, gguf_name: str, rows: int) -> RowTransform | None:
        self.reorders.append((gguf_name, rows))
        return RowTransform("rows reversed", np.arange(rows)[::-1]) if gguf_name == "t.d" else None

    def derivations(self, source_names: Collection[str]) -> list[Derivation]:
        offered = [value_map("t.v", "v.weight", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1)]
        return offered if "v.weight" in source_names else []


def _info(name: str, numpy_shape: tuple[int, ...], type_name: str = "F32") -> TensorInfo:
    return TensorInfo(name, tuple(reversed(numpy_shape)), GGML_TYPES_BY_NAME[type_name], 0, 0)


def test_one_to_one_tensors_are_paired_classified_or_blocked(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test", "num_hidden_layers": 1}))
    rows = RNG.standard_normal((4, 8)).astype(np.float32)
    save_file({"a.weight": rows, "b.weight": rows.astype(np.float16), "c.weight": rows, "d.weight": rows,
               "e.weight": rows[:1], "f.weight": rows, "g.weight": rows, "h.weight": rows,
               "i.int": np.arange(8, dtype=np.int32), "k.weight": rows, "o.rotary": rows, "v.weight": rows,
               "w.weight": rows}, str(tmp_path / "model.safetensors"))
    layout = GGUFLayout(Path("x.gguf"), 3, 32, {}, (
        _info("t.a", (4, 8)), _info("t.b", (4, 8)), _info("t.c", (4, 8), "Q8_0"), _info("t.d", (4, 8)),
        _info("t.e", (8,)), _info("t.f", (8, 4)), _info("t.i", (8,)), _info("t.v", (4, 8)),
        _info("t.extra", (8,))), 0, 0)
    _OneToOne.reorders.clear()
    inventory = take_inventory(_OneToOne({"num_hidden_layers": 1}), layout, open_source(tmp_path))

    assert inventory.classification == {
        "a.weight": "renamed (copied)", "b.weight": "renamed (cast)", "c.weight": "renamed (quantized)",
        "d.weight": "transformed (rows reversed)", "e.weight": "renamed (copied)", "f.weight": "shape mismatch",
        "g.weight": "missing", "h.weight": "missing", "i.int": "missing", "k.weight": "missing",
        "o.rotary": "omitted: computed at load", "v.weight": "transformed (stored as 1 + w) into t.v",
        "w.weight": "missing"}
    assert [(p.gguf_name, p.source.name) for p in inventory.pairs] == [
        ("t.v", "v.weight"), ("t.a", "a.weight"), ("t.b", "b.weight"), ("t.c", "c.weight"), ("t.d", "d.weight"),
        ("t.e", "e.weight")]
    transforms = {p.gguf_name: p.transform for p in inventory.pairs}
    assert transforms["t.d"] is not None and transforms["t.d"].order.tolist() == [3, 2, 1, 0]
    assert transforms["t.a"] is None
    assert sorted(_OneToOne.reorders) == [("t.a", 4), ("t.b", 4), ("t.c", 4), ("t.d", 4), ("t.e", 1)]
    assert all(type(rows) is int for _, rows in _OneToOne.reorders)
    assert {b.gate for b in inventory.blockers} == {"storage"}
    assert sorted((b.code, b.tensor, b.why) for b in inventory.blockers) == [
        ("tensor.missing", "g.weight", "source tensor 'g.weight' is not in the GGUF (expected as 't.absent')"),
        ("tensor.missing", "h.weight", "source tensor 'h.weight' is not in the GGUF (no GGUF name maps to it)"),
        ("tensor.missing", "i.int", "source tensor 'i.int' is not in the GGUF (no GGUF name maps to it)"),
        ("tensor.missing", "k.weight", "'k.weight' and 'a.weight' both map to 't.a'"),
        ("tensor.missing", "w.weight", "'w.weight' and 'v.weight' both map to 't.v'"),
        ("tensor.shape_mismatch", "t.f", "t.f has shape [8, 4], source f.weight has [4, 8]"),
        ("tensor.unexpected", "t.extra", "GGUF tensor 't.extra' has no source tensor"),
        ("tensor.unexpected", "t.i", "GGUF tensor 't.i' has no source tensor")]


def _refuse(parts: object) -> DerivedTensor:
    raise ValueError("parts disagree")


def test_a_failed_derivation_says_why_and_marks_its_sources_missing(source):
    layout, _ = _layout({"t.absent_source": NORM, "t.twice": NORM, "t.build": NORM, "t.slice": POSITIONS})
    arch = _plan(
        value_map("t.absent_source", "nope", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1),
        value_map("t.not_in_gguf", "experts.0.w", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1),
        value_map("t.twice", "norm", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1),
        value_map("t.twice", "experts.1.w", "stored as 1 + w", lambda w: w + 1, lambda v: v - 1),
        Derivation("t.build", ("experts.2.w",), "refused", _refuse),
        row_slice("t.slice", "pos", slice(1, None), "offset dropped"),
    )
    inventory = take_inventory(arch, layout, source)
    assert sorted((b.code, b.tensor, b.why) for b in inventory.blockers) == [
        ("tensor.missing", "t.absent_source", "t.absent_source (stored as 1 + w): source tensors ['nope'] are absent"),
        ("tensor.missing", "t.not_in_gguf", "t.not_in_gguf (stored as 1 + w): 't.not_in_gguf' is not in the GGUF"),
        ("tensor.missing", "t.twice", "t.twice (stored as 1 + w): 't.twice' is claimed twice"),
        ("tensor.shape_mismatch", "t.build", "t.build (refused): parts disagree"),
        ("tensor.shape_mismatch", "t.slice", "t.slice has shape [6, 8], source pos[1:] has [5, 8]"),
        ("tensor.unexpected", "t.absent_source", "GGUF tensor 't.absent_source' has no source tensor")]
    assert {name: inventory.classification[name] for name in ("nope", "experts.0.w", "experts.1.w")} == {
        "nope": "missing", "experts.0.w": "missing", "experts.1.w": "missing"}
    assert inventory.classification["norm"] == "transformed (stored as 1 + w) into t.twice"
    assert [p.gguf_name for p in inventory.pairs] == ["t.twice"]


@pytest.mark.parametrize(("stored_type", "classified"), [
    ("F32", "renamed (copied)"), ("F16", "renamed (cast)"), ("BF16", "renamed (cast)"), ("F64", "renamed (cast)"),
    ("Q8_0", "renamed (quantized)"), ("Q4_K", "renamed (quantized)"),
])
def test_a_tensor_stored_as_another_float_type_is_cast_not_quantized(tmp_path, stored_type, classified):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test", "num_hidden_layers": 1}))
    save_file({"a.weight": NORM}, str(tmp_path / "model.safetensors"))
    layout = GGUFLayout(Path("x.gguf"), 3, 32, {}, (_info("t.a", (8,), stored_type),), 0, 0)
    inventory = take_inventory(_OneToOne({"num_hidden_layers": 1}), layout, open_source(tmp_path))
    assert inventory.classification == {"a.weight": classified} and inventory.blockers == ()
