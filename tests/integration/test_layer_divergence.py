"""Gate 2 names the first layer where llama.cpp and the reference part, for a defect planted in one block."""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.blockers import Blocker
from engine.formats.gguf_structure import read_layout
from engine.gates.runtime import gate as runtime_gate
from engine.gates.runtime.layer_divergence import (
    LAYER_MARGIN,
    MAX_TRACE_POSITIONS,
    MEASURED_LAYERS,
    failing_input,
    first_divergent_layer,
    layer_tolerance,
    locate_divergence,
    measure_curves,
    reference_errors,
    relative_error,
)
from engine.gates.runtime.relevance_parity import RERANK_SET
from engine.quant.compute import COMPUTE_CLASSES, compute_classes
from engine.runtime import layer_trace
from engine.runtime.layer_trace import TraceError, trace_layers
from engine.runtime.llama_candidate import LlamaCandidate
from engine.texts import PROBE_TEXTS, Text
from tests.conftest import codes, defect_copy, run_gates

ENGLISH = (
    "How do I verify that a converted model matches the original weights?",
    "Platform teams gate every quantized model before it ships.",
    "a",
)
MEASURED_TEXTS = ENGLISH + tuple(t.text for t in PROBE_TEXTS)  # the probe is measured on every run
GATE2_PREFIXES = ("embedding.", "logits.", "rerank.", "measurement.", "quality.")


def _scale_f16(factor: float):
    def mutate(raw: np.ndarray) -> None:
        values = raw.view("<f2")
        values[:] = (values.astype(np.float32) * factor).astype(np.float16)
    return mutate


def _source_as_correctness_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rerankers have no default quality budget (no trained reranker was measured), so a weight defect is
    gate 1's alone. To drive the trace on a reranker, the correctness reference is swapped for the source's
    weights (a fake: the real artifact reference runs the defective weights too), which makes the planted
    defect a correctness failure the trace must place."""
    real = runtime_gate.references

    def source_twice(*args, **kwargs):
        chosen = real(*args, **kwargs)
        return dataclasses.replace(chosen, correct=chosen.source)

    monkeypatch.setattr(runtime_gate, "references", source_twice)


def _divergence(source: Path, artifact: Path) -> tuple[dict, list]:
    """A weight defect in a float file: correctness passes (transformers runs the same defective weights),
    the gap to the source is over the float budget, and the trace against the source names the layer."""
    report = run_gates(source, artifact, {2}, texts=ENGLISH)
    gate2 = [b for b in report.blockers if b.code.startswith(GATE2_PREFIXES)]
    assert gate2, f"the planted defect did not fail gate 2: {codes(report)}"
    return report.gates["runtime"].details["layer_divergence"], gate2


@pytest.mark.coverage(arch="llama", types=("F16",), imatrix=False, proves="NO-GO", gates="2",
                      defect="blk.1.attn_output scaled by 1.5")
def test_decoder_defect_in_last_block_first_diverges_there(tiny_llama, tmp_path):
    # every decoder fixture has two blocks: the defect goes in the second, the first must stay clean
    twin = defect_copy(tiny_llama / "tiny-llama-F16.gguf", tmp_path, "blk.1.attn_output.weight", _scale_f16(1.5))
    divergence, blockers = _divergence(tiny_llama / "source", twin)
    tolerance = layer_tolerance(("f16",))
    assert divergence["against"] == "the source's weights"
    assert {b.code for b in blockers} <= {"quality.kl_above_budget", "quality.same_top_below_budget",
                                          "quality.ppl_above_budget"}
    assert divergence["layers"][0] <= tolerance < divergence["layers"][1]
    assert divergence["first_divergent_layer"] == 1
    assert divergence["text"] in MEASURED_TEXTS
    assert all("first diverges at layer 1" in b.why for b in blockers)


@pytest.mark.coverage(arch="llama", types=("F16",), imatrix=False, proves="NO-GO", gates="2",
                      defect="output head scrambled")
def test_defect_after_the_last_block_leaves_every_layer_within_tolerance(tiny_llama, tmp_path):
    def reverse(raw: np.ndarray) -> None:
        values = raw.view("<f2")
        values[:] = values[::-1].copy()

    twin = defect_copy(tiny_llama / "tiny-llama-F16.gguf", tmp_path, "output.weight", reverse)
    divergence, blockers = _divergence(tiny_llama / "source", twin)
    assert divergence["first_divergent_layer"] is None
    assert max(divergence["layers"]) <= divergence["tolerance"]
    agree = ("; every layer agrees within 0.0055 on the traced text, so the models part after the last layer "
             "(output norm, pooling, head) or before the first (token ids)")
    assert all(b.why.endswith(agree) for b in blockers)


def test_honest_file_has_no_divergence_entry(tiny_llama):
    report = run_gates(tiny_llama / "source", tiny_llama / "tiny-llama-Q8_0.gguf", {2}, texts=ENGLISH)
    assert report.gates["runtime"].status == "passed"
    assert "layer_divergence" not in report.gates["runtime"].details


@pytest.mark.parametrize(("folder", "artifact"), [
    ("minilm", "minilm-F16.gguf"),
    ("minilm", "minilm-Q4_K_M.gguf"),
    ("tiny-llama", "tiny-llama-Q8_0.gguf"),
])
def test_honest_curve_stays_under_its_class_tolerance(folder, artifact, minilm, tiny_llama):
    root = {"minilm": minilm, "tiny-llama": tiny_llama}[folder]
    tolerance = layer_tolerance(compute_classes(read_layout(root / artifact)))
    curves = measure_curves(root / "source", root / artifact, ENGLISH)
    assert all(0 < error <= tolerance for curve in curves for error in curve)
    assert len(curves) == len(ENGLISH) and {len(curve) for curve in curves} == {6 if folder == "minilm" else 2}


@pytest.mark.coverage(arch="bert (reranker, XLM-RoBERTa)", types=("F16",), imatrix=False, proves="NO-GO",
                      gates="2", defect="blk.1.attn_output scaled by 1.5")
def test_reranker_defect_names_the_pair_and_its_layer(bge_reranker, tmp_path, monkeypatch):
    _source_as_correctness_reference(monkeypatch)
    twin = defect_copy(bge_reranker / "F16.gguf", tmp_path, "blk.1.attn_output.weight", _scale_f16(1.5))
    divergence, blockers = _divergence(bge_reranker / "source", twin)
    first_query = next(b.text for b in blockers if b.text is not None)
    assert divergence["text"].startswith(first_query + " | ")
    assert divergence["layers"][0] <= divergence["tolerance"] < divergence["layers"][1]
    assert divergence["first_divergent_layer"] == 1


def test_a_graph_without_the_expected_layer_nodes_is_a_trace_error(tiny_llama):
    candidate = LlamaCandidate(tiny_llama / "tiny-llama-Q8_0.gguf", embedding=False, n_ctx=64)
    try:
        ids = candidate.tokenize("a", add_special=True, parse_special=False)
        assert trace_layers(candidate.llm.model, "llama", ids).shape == (2, len(ids), 256)
        with pytest.raises(TraceError, match=r"no output captured for layers \[0, 1\]"):
            trace_layers(candidate.llm.model, "bert", ids)  # no biased norms in a llama graph
    finally:
        candidate.close()


def test_relative_error_and_the_first_layer_beyond_tolerance():
    reference = np.ones((2, 4))
    candidate = reference.copy()
    candidate[0, 0] += 2.0  # ||diff|| 2 over ||ref|| sqrt(8)
    assert relative_error(candidate, reference) == pytest.approx(2 / np.sqrt(8))
    assert relative_error(-reference, reference) == pytest.approx(2.0)
    assert relative_error(np.ones((1, 2)), np.zeros((1, 2))) == float("inf")
    assert relative_error(np.full((1, 2), 0.01), np.full((1, 2), 0.02)) == pytest.approx(0.5)  # a norm below 1
    with pytest.raises(ValueError, match="differ"):
        relative_error(np.ones((3, 4)), reference)
    errors = [0.0, 2 / np.sqrt(8), 2.0]
    assert first_divergent_layer(errors, 0.5) == 1
    assert first_divergent_layer(errors, 2 / np.sqrt(8)) == 2  # equal to the tolerance is within
    assert first_divergent_layer(errors, 2.0) is None
    assert first_divergent_layer([0.0, float("nan"), 9.0], 1.0) == 1  # NaN is never within


def test_tolerance_is_the_margin_over_the_worst_honest_error_rounded_outward():
    for name in COMPUTE_CLASSES:
        worst = max(m.worst for m in MEASURED_LAYERS if m.compute == name)
        assert LAYER_MARGIN * worst <= layer_tolerance((name,)) <= 1.1 * LAYER_MARGIN * worst
    assert layer_tolerance(("f16",)) < layer_tolerance(("bf16",)) < layer_tolerance(("q8_k",))
    assert layer_tolerance(("f16", "q8_0")) == layer_tolerance(("q8_0",))  # a mixed file: its coarsest class
    with pytest.raises(ValueError):
        layer_tolerance(("2bit",))  # type: ignore[arg-type]


@pytest.mark.coverage(arch="bert", types=("F16",), imatrix=False, proves="NO-GO", gates="2",
                      defect="blk.2.ffn_down scaled by 1.5")
def test_encoder_defect_in_block_2_first_diverges_at_layer_2(minilm, tmp_path):
    twin = defect_copy(minilm / "minilm-F16.gguf", tmp_path, "blk.2.ffn_down.weight", _scale_f16(1.5))
    divergence, blockers = _divergence(minilm / "source", twin)
    tolerance = layer_tolerance(("f16",))
    assert divergence["tolerance"] == tolerance
    assert divergence["criterion"] == "relative L2 error per layer > 3x the worst honest f32/f16"
    assert divergence["text"] in MEASURED_TEXTS
    assert len(divergence["layers"]) == 6
    assert max(divergence["layers"][:2]) <= tolerance < divergence["layers"][2]
    assert divergence["first_divergent_layer"] == 2
    assert all("first diverges at layer 2" in b.why for b in blockers)


def _op(name: bytes) -> int:
    return next(op for op in range(200) if layer_trace._ggml().ggml_op_name(op) == name)


def _node(name: str, op: bytes = b"NONE", sources: tuple[layer_trace._Tensor, ...] = (),
          dtype: int = layer_trace.GGML_TYPE_F32) -> layer_trace._Tensor:
    node = layer_trace._Tensor(type=dtype, op=_op(op), name=name.encode())
    node.ne[0], node.ne[1], node.ne[2], node.ne[3] = 4, 2, 1, 1
    node.nb[0], node.nb[1] = 2, 8
    for index, source in enumerate(sources):
        node.src[index] = ctypes.addressof(source)
    return node


def test_layer_outputs_are_recognised_by_name_or_by_their_inputs():
    norm_w, ffn_inp = _node("norm_w-3", b"MUL"), _node("ffn_inp-4", b"ADD")
    bias_add = _node("", b"ADD", (norm_w, _node("blk.3.bias")))
    residual = _node("", b"ADD", (_node("ffn_out-4"), ffn_inp))
    bert, modern, default = (layer_trace.layer_matcher(a) for a in ("bert", "modern-bert", "qwen3"))
    assert [bert(bias_add), bert(_node("", b"MUL", (norm_w,))), bert(residual)] == [3, None, None]
    assert [modern(residual), modern(bias_add), modern(_node("", b"MUL", (ffn_inp,)))] == [4, None, None]
    assert [default(_node("l_out-12")), default(_node("l_out-1x")), default(_node("xl_out-1"))] == [12, None, None]


def test_the_callback_asks_only_for_layer_outputs_and_refuses_what_it_cannot_copy():
    capture = layer_trace._Capture(layer_trace.layer_matcher("llama"))
    layer, other = _node("l_out-0", dtype=1), _node("attn_out-0")  # an F16 layer output cannot be copied
    assert capture(ctypes.addressof(other), True, None) is False
    assert capture(ctypes.addressof(layer), True, None) is True
    assert capture(ctypes.addressof(other), False, None) is True
    assert capture.error is None
    assert capture(ctypes.addressof(layer), False, None) is False
    assert capture.error == "TraceError: 'l_out-0' is not a contiguous F32 [4 x 2] matrix"
    assert capture.layers == {}


@pytest.mark.parametrize("defect", ["half precision", "row padding", "element stride", "third dimension"])
def test_a_layer_output_that_is_not_a_plain_f32_matrix_is_refused_before_copying(defect):
    layer = _node("l_out-1")
    layer.nb[0], layer.nb[1] = 4, 16  # a contiguous [4 x 2] F32 matrix, but for:
    if defect == "half precision":
        layer.type = 1
    elif defect == "row padding":
        layer.nb[1] = 32
    elif defect == "element stride":
        layer.nb[0] = 8
    else:
        layer.ne[2], layer.ne[3] = 3, 1  # 24 elements where a [4 x 2] matrix has 8
    capture = layer_trace._Capture(layer_trace.layer_matcher("qwen2"))
    assert capture(ctypes.addressof(layer), False, None) is False  # refused before ggml reads any data
    assert capture.error == "TraceError: 'l_out-1' is not a contiguous F32 [4 x 2] matrix"


def test_a_failed_decode_and_a_failed_trace_are_reported_not_raised(tiny_llama):
    candidate = LlamaCandidate(tiny_llama / "tiny-llama-Q8_0.gguf", embedding=False, n_ctx=64)
    try:
        with pytest.raises(TraceError, match="llama_decode returned -1"):
            trace_layers(candidate.llm.model, "llama", [10**7])  # no such token
        blocker = Blocker(code="logits.kl_above_threshold", gate="runtime", why="kl_mean 1 vs max 0.1")
        details: dict = {"logits": {"per_text": [{"label": "t", "kl_mean": 1.0}]}}
        found = locate_divergence([blocker], details, texts=(Text("t", "a"),), model=SimpleNamespace(model=None),
                                  candidate=candidate, architecture="bert", classes=("q8_0",))
        long_text = {"logits": {"per_text": [{"label": "t", "kl_mean": 1.0}]}}
        locate_divergence([blocker], long_text, texts=(Text("t", "a b" * 100),), model=SimpleNamespace(model=None),
                          candidate=candidate, architecture="bert", classes=("q8_0",))
    finally:
        candidate.close()
    assert details["layer_divergence"]["text"] == "a"
    assert details["layer_divergence"]["positions"] == 2  # BOS, "a"
    assert details["layer_divergence"]["tolerance"] == layer_tolerance(("q8_0",))
    assert details["layer_divergence"]["error"].startswith("TraceError: no output captured")
    assert "layers" not in details["layer_divergence"]
    assert long_text["layer_divergence"]["positions"] == MAX_TRACE_POSITIONS
    assert found[0].why.startswith("kl_mean 1 vs max 0.1; layer trace unavailable: TraceError")


class _Tokens:
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        assert add_special is True and parse_special is False
        return [len(text)]

    def pair_tokens(self, query: str, document: str) -> list[int]:
        return [len(query), len(document)]


TEXTS = (Text("one", "first text"), Text("two", "second"), Text("three", "third one"))


def test_the_traced_input_is_the_first_named_text_else_the_worst_measured():
    named = [Blocker(code="embedding.top1_mismatch", gate="runtime", why="w"),
             Blocker(code="embedding.cosine_below_threshold", gate="runtime", why="w", text="second")]
    embeddings = {"embeddings": {"per_text": [{"label": "one", "cosine": 0.9}, {"label": "three", "cosine": 0.5},
                                              {"label": "two", "cosine": 0.7}]}}
    assert failing_input(named, embeddings, TEXTS, _Tokens()) == ("second", [6])
    assert failing_input(named[:1], embeddings, TEXTS, _Tokens()) == ("third one", [9])
    logits = {"logits": {"per_text": [{"label": "one", "kl_mean": 0.1}, {"label": "two", "kl_mean": 0.3},
                                      {"label": "three", "kl_mean": 0.2}]}}
    assert failing_input(named[:1], logits, TEXTS, _Tokens()) == ("second", [6])
    assert failing_input(named[:1], {"logits": {"per_text": []}}, TEXTS, _Tokens()) is None
    assert failing_input(named[:1], {"embeddings": {"per_text": []}}, TEXTS, _Tokens()) is None


def test_the_traced_pair_is_the_worst_scored_document_of_the_first_failing_query():
    first, second = RERANK_SET[0], RERANK_SET[1]
    rows = [{"query": first.label, "document": 0, "abs_diff": 0.5},
            {"query": second.label, "document": 0, "abs_diff": 0.1},
            {"query": second.label, "document": 1, "abs_diff": float("nan")},
            {"query": second.label, "document": 2, "abs_diff": 0.3}]
    named = [Blocker(code="rerank.order_mismatch", gate="runtime", why="w", text=second.query)]
    pair = (second.query, second.documents[1])
    assert failing_input(named, {"relevance": {"per_pair": rows}}, (), _Tokens()) == (
        " | ".join(pair), [len(pair[0]), len(pair[1])])
    unnamed = [Blocker(code="rerank.order_mismatch", gate="runtime", why="w")]
    assert failing_input(unnamed, {"relevance": {"per_pair": rows[:2]}}, (), _Tokens())[0].startswith(first.query)
    assert failing_input(unnamed, {"relevance": {"per_pair": []}}, (), _Tokens()) is None


class _Blocks(torch.nn.Module):
    """A three-block reference: embedding, then blocks returning (hidden, extra) tuples as HF layers do."""

    def __init__(self, n_layer: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = SimpleNamespace(num_hidden_layers=n_layer)
        self.embed = torch.nn.Embedding(16, 4)
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(n_layer))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        assert input_ids.dtype == torch.long and torch.equal(attention_mask, torch.ones_like(input_ids))
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        return hidden


def test_reference_errors_compare_each_block_output_as_it_is_produced():
    model = _Blocks().eval()
    ids = [1, 2, 3]
    with torch.inference_mode():
        hidden = model.embed(torch.tensor([ids]))
        layers = []
        for block in model.blocks:
            hidden = block(hidden)
            layers.append(hidden[0].numpy().copy())
    candidate = np.stack(layers)
    assert reference_errors(model, ids, candidate) == [0.0, 0.0, 0.0]
    candidate[1] *= 1.5
    assert reference_errors(model, ids, candidate) == pytest.approx([0.0, 0.5, 0.0])
    assert not any(block._forward_hooks for block in model.blocks)  # hooks removed after the run
    with pytest.raises(ValueError, match=r"llama\.cpp has 2 layers, the reference 3"):
        reference_errors(model, ids, candidate[:2])
    model.config.num_hidden_layers = 4
    with pytest.raises(ValueError, match="the reference has no list of 4 layer modules to hook"):
        reference_errors(model, ids, candidate)


def test_a_callback_failure_or_a_missing_context_stops_the_trace(tiny_llama, monkeypatch):
    import llama_cpp

    candidate = LlamaCandidate(tiny_llama / "tiny-llama-Q8_0.gguf", embedding=False, n_ctx=64)
    try:
        with monkeypatch.context() as patched:
            patched.setattr(layer_trace._Capture, "_copy", staticmethod(_refuse))
            with pytest.raises(TraceError, match=r"^tracing stopped: TraceError: refused l_out-0$"):
                trace_layers(candidate.llm.model, "llama", [1, 2])
        with monkeypatch.context() as patched:
            patched.setattr(llama_cpp, "llama_init_from_model", lambda *_: None)
            with pytest.raises(TraceError, match=r"^llama\.cpp could not create a tracing context$"):
                trace_layers(candidate.llm.model, "llama", [1, 2])
    finally:
        candidate.close()


def _refuse(_pointer: int, tensor: layer_trace._Tensor) -> np.ndarray:
    raise TraceError(f"refused {tensor.name.decode()}")


def test_an_error_that_grows_through_every_layer_is_not_blamed_on_the_head():
    """Seen on an honest random-weight 1.7B Q8_0 (28 layers): no layer past the tolerance, the last one
    near it, the output below gate 2's floor. The rounding of every layer adds up; the old message sent
    the reader to the output norm, pooling and head."""
    from engine.gates.runtime.layer_divergence import _suffix

    growing = {"tolerance": 0.084, "first_divergent_layer": None, "layers": [0.004, 0.02, 0.045, 0.061]}
    why = _suffix(growing)
    assert "grows through the layers to 0.061 at the last" in why and "head" not in why
    flat = {"tolerance": 0.041, "first_divergent_layer": None, "layers": [0.001, 0.002]}
    assert _suffix(flat).endswith("so the models part after the last layer (output norm, pooling, head) or "
                                  "before the first (token ids)")
