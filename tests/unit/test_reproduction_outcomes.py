"""Items 2 and 3: quants we cannot reproduce for a non-defect reason vs defects, and who decides GO."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.acceptance import accept_unreproduced
from engine.blockers import Blocker
from engine.formats.ggml_types import GGML_TYPES_BY_NAME
from engine.formats.gguf_structure import TensorInfo
from engine.formats.source import open_source
from engine.gates.storage.systematic import quantizer_build, reclassify
from engine.gates.storage.tensor_values import check_tensor
from engine.policy import Policy
from engine.quant import reference
from engine.report import GateResult, TensorRow

Q8_0 = GGML_TYPES_BY_NAME["Q8_0"]
NAMES = ("blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_up.weight")


def source_rows(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((8, 256)) * 0.05).astype(np.float32)


def headroom_q8_0(x: np.ndarray) -> bytes:
    """An honest custom Q8_0 quantizer: d = amax/126 (one code of headroom), codes round(x/d)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    d = (np.abs(blocks).max(axis=1, keepdims=True) / 126).astype(np.float16)
    q = np.clip(np.round(blocks / np.where(d == 0, 1, d).astype(np.float32)), -127, 127).astype(np.int8)
    return b"".join(d[i].tobytes() + q[i].tobytes() for i in range(blocks.shape[0]))


def check_file(tmp_path: Path, stored: dict[str, bytes], policy: Policy | None = None, type_name: str = "Q8_0"):
    """check_tensor on each tensor, then the file-level reclassification storage applies."""
    policy = policy or Policy()
    rows, blockers = [], []
    for index, name in enumerate(NAMES):
        folder = tmp_path / str(index)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "test"}))
        save_file({"w": source_rows(index)}, str(folder / "model.safetensors"))
        info = TensorInfo(name, (256, 8), GGML_TYPES_BY_NAME[type_name], 0, len(stored[name]))
        row, found = check_tensor(np.frombuffer(stored[name], np.uint8), info, open_source(folder).tensors["w"],
                                  None, policy)
        rows.append(row)
        blockers.extend(found)
    return rows, reclassify(rows, blockers, policy.systematic_fraction)


def honest(type_name: str = "Q8_0", weights: np.ndarray | None = None) -> dict[str, bytes]:
    return {name: reference.quantize(source_rows(i), GGML_TYPES_BY_NAME[type_name], quant_weights=weights).tobytes()
            for i, name in enumerate(NAMES)}


def codes(blockers: list[Blocker]) -> list[str]:
    return sorted(b.code for b in blockers)


@pytest.mark.coverage(arch="llama (single tensors)", types=("Q8_0",), imatrix=False, proves="NO-GO",
                      defect="custom quantizer (systematic)", gates="1")
def test_another_honest_quantizer_is_systematic_not_a_mismatch(tmp_path):
    stored = {name: headroom_q8_0(source_rows(i)) for i, name in enumerate(NAMES)}
    rows, blockers = check_file(tmp_path, stored)
    assert codes(blockers) == ["tensor.other_quantizer"]
    assert all(row.bound_violations == 0 and row.reader_crosscheck == "agree" for row in rows)
    why = blockers[0].why
    assert "3 Q8_0 tensors" in why and "64 of 64 blocks" not in why and "llama-cpp-python" in why
    assert f"{sum(r.mismatched for r in rows)} of {sum(r.blocks or 0 for r in rows)} blocks" in why


def q4_0_over_minus_7(x: np.ndarray) -> bytes:
    """A publisher's Q4_0 variant seen in the field: `d = max / -7` instead of llama.cpp's `max / -8` (the two-line
    patch to quantize_row_q4_0_ref discussed in ik_llama.cpp PR #1556 for re-quantizing Kimi-K2 "Q4_X" files)."""
    blocks = x.reshape(-1, 32).astype(np.float32)
    signed_max = blocks[np.arange(blocks.shape[0]), np.abs(blocks).argmax(axis=1)]
    d = (signed_max / np.float32(-7)).astype(np.float32)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.minimum(15, (blocks * inverse[:, None] + np.float32(8.5)).astype(np.int8)).astype(np.uint8)
    packed = q[:, :16] | (q[:, 16:] << 4)
    return b"".join(d[i].astype(np.float16).tobytes() + packed[i].tobytes() for i in range(blocks.shape[0]))


@pytest.mark.coverage(arch="llama (single tensors)", types=("Q4_0",), imatrix=False, proves="NO-GO",
                      defect="a publisher's Q4_0 variant (max/-7): not reproduced, not a mismatch", gates="1")
def test_a_real_publisher_variant_of_q4_0_is_another_quantizer_not_a_defect(tmp_path):
    stored = {name: q4_0_over_minus_7(source_rows(i)) for i, name in enumerate(NAMES)}
    rows, blockers = check_file(tmp_path, stored, type_name="Q4_0")
    # Q4_0 takes an importance matrix, so without one a systematic difference may be either cause; both named.
    assert codes(blockers) == ["tensor.not_reproduced"] and "or by another quantizer" in blockers[0].why
    assert all(row.bound_violations == 0 and row.reader_crosscheck == "agree" for row in rows)
    assert all(row.mismatched >= 0.5 * (row.blocks or 0) for row in rows)
    one_changed = honest("Q4_0")
    one_changed[NAMES[0]] = stored[NAMES[0]]
    (tmp_path / "one").mkdir()
    _, blockers = check_file(tmp_path / "one", one_changed, Policy(other_quantizer="gate2"), type_name="Q4_0")
    assert codes(blockers) == ["tensor.reproduction_mismatch"] and blockers[0].tensor == NAMES[0]


@pytest.mark.coverage(arch="llama (single tensors)", types=("Q8_0",), imatrix=False, proves="NO-GO",
                      defect="one code moved one step", gates="1")
def test_one_code_moved_in_an_otherwise_reproducing_file_stays_a_defect(tmp_path):
    stored = honest()
    raw = bytearray(stored[NAMES[1]])
    raw[34 * 5 + 2 + 7] = (raw[34 * 5 + 2 + 7] + 1) % 256
    stored[NAMES[1]] = bytes(raw)
    _, blockers = check_file(tmp_path, stored, Policy(other_quantizer="gate2"))
    assert "tensor.reproduction_mismatch" in codes(blockers)
    assert [b.tensor for b in blockers if b.code == "tensor.reproduction_mismatch"] == [NAMES[1]]


@pytest.mark.coverage(arch="llama (single tensors)", types=("Q8_0",), imatrix=False, proves="NO-GO",
                      defect="one tensor from another quantizer", gates="1")
def test_a_defect_confined_to_one_tensor_stays_a_defect(tmp_path):
    stored = honest()
    stored[NAMES[2]] = headroom_q8_0(source_rows(2))  # every block of this tensor differs, within the bound
    _, blockers = check_file(tmp_path, stored, Policy(other_quantizer="gate2"))
    assert codes(blockers) == ["tensor.reproduction_mismatch"] and blockers[0].tensor == NAMES[2]


@pytest.mark.coverage(arch="llama (single tensors)", types=("Q4_K",), imatrix=True, proves="NO-GO",
                      defect="imatrix not supplied (not reproduced)", gates="1")
def test_an_imatrix_quant_without_its_imatrix_is_not_reproduced_not_a_mismatch(tmp_path):
    weights = np.random.default_rng(5).uniform(0.01, 10.0, 256).astype(np.float32)
    rows, blockers = check_file(tmp_path, honest("Q4_K", weights), type_name="Q4_K")
    assert codes(blockers) == ["tensor.not_reproduced"]
    assert "supply the imatrix" in blockers[0].why and all(row.bound_violations == 0 for row in rows)


RUNTIME_PASSED = {"storage": GateResult(name="storage", status="failed"),
                  "runtime": GateResult(name="runtime", status="passed")}
NOT_REPRODUCED = Blocker(code="tensor.not_reproduced", gate="storage", why="3 Q4_K tensors ...")
OTHER = Blocker(code="tensor.other_quantizer", gate="storage", why="3 Q8_0 tensors ...")


def test_default_policy_keeps_unreproduced_quants_no_go():
    assert accept_unreproduced([NOT_REPRODUCED, OTHER], RUNTIME_PASSED, Policy()) == ([NOT_REPRODUCED, OTHER], [])


@pytest.mark.parametrize(("policy", "blocker"), [(Policy(without_imatrix="gate2"), NOT_REPRODUCED),
                                                 (Policy(other_quantizer="gate2"), OTHER)])
def test_opt_in_policy_accepts_only_on_a_passing_gate_2(policy, blocker):
    remaining, notes = accept_unreproduced([blocker], RUNTIME_PASSED, policy)
    assert remaining == [] and len(notes) == 1 and blocker.why in notes[0]
    failed = {**RUNTIME_PASSED, "runtime": GateResult(name="runtime", status="failed")}
    assert accept_unreproduced([blocker], failed, policy) == ([blocker], [])
    assert accept_unreproduced([blocker], {"storage": RUNTIME_PASSED["storage"]}, policy) == ([blocker], [])
    defect = Blocker(code="tensor.value_mismatch", gate="storage", why="bound")
    assert accept_unreproduced([blocker, defect], RUNTIME_PASSED, policy) == ([blocker, defect], [])


def test_opting_in_for_one_reason_does_not_accept_the_other():
    policy = Policy(without_imatrix="gate2")
    assert accept_unreproduced([OTHER], RUNTIME_PASSED, policy) == ([OTHER], [])


def test_an_accepted_note_names_the_tensor_only_when_the_blocker_has_one():
    with_tensor = Blocker(code="tensor.other_quantizer", gate="storage", why="differs", tensor="blk.0.attn_q.weight")
    _, notes = accept_unreproduced([OTHER, with_tensor], RUNTIME_PASSED, Policy(other_quantizer="gate2"))
    prefix = "bytes not reproduced, accepted by policy on gate 2's measurements: "
    assert notes == [prefix + OTHER.why, prefix + "differs (blk.0.attn_q.weight)"]


def _row(name: str, mismatched: int, blocks: int | None = 10, type_name: str = "Q8_0",
         check: str = "reproduced") -> TensorRow:
    return TensorRow(gguf_name=name, source_names=[name], transform=None, gguf_type=type_name, source_dtype="F32",
                     shape=[8, 256], check=check, max_abs=0.0, rel_l2=0.0, mismatched=mismatched, blocks=blocks,
                     result="ok")


def _wholly(count: int, type_name: str = "Q8_0") -> list[TensorRow]:
    return [_row(f"blk.{i}.{type_name}.weight", 5, type_name=type_name) for i in range(count)]


@pytest.mark.parametrize(("rows", "systematic"), [
    (_wholly(2), True),  # exactly two tensors, each at exactly the fraction
    (_wholly(1), False),  # one tensor alone is isolated
    ([*_wholly(2), _row("blk.9.x.weight", 1)], False),  # one tensor differs in too few blocks
    ([*_wholly(2), _row("blk.9.x.weight", 4)], False),  # just under the fraction
    ([*_wholly(2), _row("blk.9.x.weight", 1, check="bounded")], True),  # not a reproduction: not counted
    ([*_wholly(2), _row("blk.9.x.weight", 1, blocks=None)], True),  # no blocks compared: not counted
    ([*_wholly(2), _row("token_embd.weight", 0), _row("output.weight", 0)], True),  # never weighed by an imatrix
    ([*_wholly(2), _row("token_embd.weight", 0), _row("blk.9.x.weight", 0)], False),  # a weighed one reproduces
])
def test_which_differences_are_systematic(rows, systematic):
    mismatches = [Blocker(code="tensor.reproduction_mismatch", gate="storage", why="differs", tensor=r.gguf_name)
                  for r in rows if r.mismatched and r.check == "reproduced" and r.blocks]
    blockers = reclassify(rows, mismatches, 0.5)
    assert codes(blockers) == (["tensor.other_quantizer"] if systematic else codes(mismatches))


def test_reclassify_keeps_other_blockers_and_names_each_systematic_type():
    rows = [*_wholly(7), *_wholly(6, "Q4_K"), _row("blk.0.Q6_K.weight", 5, type_name="Q6_K")]
    kept = [Blocker(code="tensor.reproduction_mismatch", gate="storage", why="isolated", tensor="blk.0.Q6_K.weight"),
            Blocker(code="tensor.value_mismatch", gate="storage", why="bound", tensor="blk.0.Q8_0.weight")]
    mismatches = [Blocker(code="tensor.reproduction_mismatch", gate="storage", why="differs", tensor=r.gguf_name)
                  for r in rows[:13]]
    blockers = reclassify(rows, kept + mismatches, 0.5)
    assert blockers[:2] == kept
    build = quantizer_build()
    q4_k = ", ".join(f"blk.{i}.Q4_K.weight" for i in range(6))
    q8_0 = ", ".join(f"blk.{i}.Q8_0.weight" for i in range(6))
    assert [(b.code, b.why) for b in blockers[2:]] == [
        ("tensor.not_reproduced", f"6 Q4_K tensors ({q4_k}) differ systematically from {build}: 30 of 60 blocks; "
         "no importance matrix was given, so they were likely quantized with one (or by another quantizer): "
         "supply the imatrix to reproduce them"),
        ("tensor.other_quantizer", f"7 Q8_0 tensors ({q8_0} and 1 more) differ systematically from {build}: "
         "35 of 70 blocks; not reproducible with the quantizer we carry")]
    weighted = reclassify(rows, mismatches, 0.5, weighted=True)
    assert codes(weighted) == ["tensor.other_quantizer", "tensor.other_quantizer"]
    q4_k_weighted, q8_0_weighted = sorted(weighted, key=lambda b: b.why)
    assert q4_k_weighted.why.endswith("with the importance matrix given; not reproducible with the quantizer we "
                                      "carry, or the file was quantized with another imatrix")
    assert q8_0_weighted.why.endswith("35 of 70 blocks; not reproducible with the quantizer we carry")


def test_the_quantizer_build_names_the_package_and_ggml(monkeypatch):
    build = quantizer_build()
    assert re.fullmatch(rf"llama-cpp-python {re.escape(metadata.version('llama-cpp-python'))}, ggml \S+ \(\S+\)",
                        build), build

    def not_installed(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert quantizer_build().startswith("llama-cpp-python (not installed), ggml ")
