"""Item 14: every hand-made hostile input gives a blocker (or a coded error), never another exception.

Runs each case of tests/fuzz/hostile.py in-process through the structure parser, the strict source
reader, gate 1, the report writer and the summary; the same set goes through the real CLI in
tests/fuzz/test_hostile_cli.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from engine.blockers import Blocker
from engine.errors import CodedError, SourceError
from engine.formats.ggml_types import ValueType
from engine.formats.gguf_structure import GGUFLayout, read_layout
from engine.formats.json_input import MAX_JSON_DEPTH, json_depth, parse_json, text_depth
from engine.formats.safetensors_strict import read_safetensors
from engine.formats.source import SourceModel, open_source
from engine.gates.runtime.gate import context_size
from engine.gates.storage.gate import open_source_or_blocker, run_storage_gate, validate_structure
from engine.policy import Policy
from engine.report import GateResult, Report
from engine.summary import render_summary
from tests.fuzz.hostile import CASES, Case, bad_string, gguf_bytes, honest_kvs, safetensors_bytes, write_honest_pair
from tests.gguf_bytes import kv_array, kv_scalar, kv_string

# Defects gate 1 does not judge: a descriptive name, and keys only llama.cpp's loader reads (gate 2).
ONLY_GATE2_CAN_TELL = {"gguf-name-bad-utf8", "gguf-tokenizer-pre-array"}


def _report(blockers: list[Blocker], gate: GateResult | None) -> Report:
    return Report(verdict="NO-GO" if blockers else "GO", blockers=blockers, gates={"storage": gate} if gate else {},
                  policy={"values": {"version": "t"}, "sha256": "0" * 64}, artifact=None, files=[],
                  not_verified=[], environment={}, timings={})


def gate1(source_dir: Path, artifact: Path) -> tuple[list[Blocker], Report]:
    """What the engine does for gate 1, then the report writer and the summary."""
    layout = validate_structure(artifact)
    if isinstance(layout, tuple):
        return list(layout), _report(list(layout), None)
    source = open_source_or_blocker(source_dir)
    if isinstance(source, Blocker):
        return [source], _report([source], None)
    result, blockers = run_storage_gate(artifact, layout, source, Policy())
    return blockers, _report(blockers, result)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_hostile_case_is_a_blocker_and_the_report_serialises(tmp_path: Path, case: Case) -> None:
    source, artifact = write_honest_pair(tmp_path)
    case.apply(source, artifact)
    blockers, report = gate1(source, artifact)
    document = report.model_dump_json()
    json.loads(document)
    document.encode("utf-8")
    render_summary(report).encode("utf-8")
    assert blockers or case.name in ONLY_GATE2_CAN_TELL, "a hostile file passed gate 1"


def test_the_honest_pair_passes_gate1_metadata(tmp_path: Path) -> None:
    """The base the cases damage is honest, so a blocker above is the defect's, not the base's."""
    blockers, _ = gate1(*write_honest_pair(tmp_path))
    assert [b.code for b in blockers] == []


@pytest.mark.parametrize(("key", "encoded"), [
    ("llama.block_count", kv_array("llama.block_count", ValueType.UINT32, [2, 2])),
    ("llama.block_count", kv_string("llama.block_count", "2")),
    ("llama.context_length", kv_scalar("llama.context_length", ValueType.FLOAT32, 256.0)),
    ("llama.embedding_length", kv_array("llama.embedding_length", ValueType.FLOAT32, [64.0])),
    ("llama.rope.freq_base", kv_string("llama.rope.freq_base", "10000")),
    ("llama.attention.layer_norm_rms_epsilon", kv_array("llama.attention.layer_norm_rms_epsilon",
                                                        ValueType.FLOAT32, [1e-5])),
    ("tokenizer.ggml.model", kv_scalar("tokenizer.ggml.model", ValueType.UINT32, 1)),
    ("tokenizer.ggml.add_eos_token", kv_scalar("tokenizer.ggml.add_eos_token", ValueType.UINT32, 1)),
], ids=lambda value: value if isinstance(value, str) else str(len(value)))
def test_a_value_of_the_wrong_type_is_a_blocker_naming_its_key(tmp_path, key, encoded):
    source, artifact = write_honest_pair(tmp_path)
    artifact.write_bytes(gguf_bytes({**honest_kvs(), key: encoded}))
    blockers, _ = gate1(source, artifact)
    assert key in {b.key for b in blockers if b.code in ("metadata.wrong_type", "tokenizer.flag_mismatch")}, blockers


def test_invalid_utf8_in_a_gguf_string_is_rendered_safely(tmp_path):
    """The parser keeps the bytes (surrogate escapes) for comparison; the report writes them as escapes."""
    source, artifact = write_honest_pair(tmp_path)
    artifact.write_bytes(gguf_bytes({**honest_kvs(), "vendor.note": bad_string("vendor.note")}))
    blockers, report = gate1(source, artifact)
    (blocker,) = [b for b in blockers if b.key == "vendor.note"]
    assert blocker.code == "metadata.unexpected_key" and "\\udcff" in blocker.why
    document = json.loads(report.model_dump_json())
    assert "\\udcff" in json.dumps(document["blockers"]) and "\\udcff" in render_summary(report)


@pytest.mark.parametrize("type_name", ["I8", "I16", "I32", "I64", "F64"])
def test_integer_and_f64_tensors_are_type_unsupported(tmp_path, type_name):
    source, artifact = write_honest_pair(tmp_path)
    artifact.write_bytes(gguf_bytes(honest_kvs(), type_name))
    blockers, _ = gate1(source, artifact)
    assert ("tensor.type_unsupported", "token_embd.weight") in {(b.code, b.tensor) for b in blockers}


def test_context_length_of_the_wrong_kind_is_a_coded_error():
    for value in (float("nan"), "256", True, -5, 0):
        layout = GGUFLayout(Path("x"), 3, 32, {"general.architecture": "llama", "llama.context_length": value},
                            (), 0, 0)
        with pytest.raises(CodedError) as info:
            context_size(layout, Policy())
        assert info.value.code == "metadata.wrong_type"


def test_json_reader_refuses_deep_nesting_huge_integers_and_lone_surrogates():
    for raw, fragment in ((b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
                          (b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), "nests deeper"),
                          (b"[" + b"9" * 5000 + b"]", "not valid JSON"),
                          (b'{"a\\ud800": 1}', "lone surrogate"), (b'["\\udc80"]', "lone surrogate"),
                          (b"\xff", "not valid UTF-8"), (b"{", "not valid JSON")):
        with pytest.raises(SourceError) as info:
            parse_json(raw, "f.json")
        assert fragment in info.value.why
    assert parse_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, "f.json") is not None
    with pytest.raises(SourceError, match="lone surrogate"):  # text handed over already decoded
        parse_json('["\ud800"]', "f.json")
    assert parse_json(b'["\\\\ud800"]', "f.json") == ["\\ud800"]  # an escaped backslash, then plain letters


def test_nesting_is_read_off_the_text_as_the_parsed_value_has_it():
    """The depth is counted on the text (fast on a megabyte tokenizer.json): brackets in strings, escaped
    quotes and backslashes must not count."""
    import json

    for text in ("1", "[]", "{}", '[[1], {"a": [2]}]', '"[[["', '{"a\\"[": [1]}', '["\\\\", [1]]',
                 '{"]": "}", "x": [[[]]]}', '["\\"]]]"]', "[" * 70 + "]" * 70):
        assert text_depth(text) == json_depth(json.loads(text)), text


# --- the safetensors reader against the reference library ---------------------------------------------

def _entry(**overrides):
    return {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **overrides}


HEADERS = {
    "dtype-list": ({"w": _entry(dtype=["F32"])}, 8), "dtype-int": ({"w": _entry(dtype=3)}, 8),
    "dtype-lowercase": ({"w": _entry(dtype="f32")}, 8),
    "bool-shape": ({"w": _entry(shape=[True, 2])}, 8), "bool-offset": ({"w": _entry(shape=[1],
                                                                                 data_offsets=[False, 4])}, 4),
    "float-shape": ({"w": _entry(shape=[2.0])}, 8), "negative-shape": ({"w": _entry(shape=[-2])}, 8),
    "metadata-list": ({"__metadata__": ["x"], "w": _entry()}, 8),
    "metadata-empty-list": ({"__metadata__": [], "w": _entry()}, 8),
    "metadata-zero": ({"__metadata__": 0, "w": _entry()}, 8),
    "metadata-empty-string": ({"__metadata__": "", "w": _entry()}, 8),
    "metadata-int-value": ({"__metadata__": {"a": 1}, "w": _entry()}, 8),
    "header-list": ([1], 0),
    "surrogate-name": (b'{"w\\ud800": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}', 8),
    "deep": (b'{"w": ' + b"[" * 200 + b"]" * 200 + b"}", 0),
    "huge-int": (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}', 8),
    "honest": ({"w": _entry()}, 8), "metadata-null": ({"__metadata__": None, "w": _entry()}, 8),
}


@pytest.mark.parametrize("name", sorted(HEADERS))
def test_safetensors_reader_is_at_least_as_strict_as_the_reference(tmp_path, name):
    from safetensors.numpy import load_file

    header, size = HEADERS[name]
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path = tmp_path / "t.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * size)
    try:
        load_file(path)
        reference_accepts = True
    except Exception:
        reference_accepts = False
    try:
        read_safetensors(path)
        ours_accepts = True
    except SourceError as exc:
        assert exc.code == "source.bad_safetensors"
        ours_accepts = False
    assert ours_accepts <= reference_accepts, f"{name}: the reference refuses it, we accepted it"
    assert ours_accepts == (name in ("honest", "metadata-null"))


def test_source_side_files_are_checked_when_the_source_is_opened(tmp_path):
    source, _ = write_honest_pair(tmp_path)
    (source / "modules.json").write_text("[1]")
    with pytest.raises(SourceError) as info:
        open_source(source)
    assert info.value.code == "source.bad_file" and "modules.json" in info.value.why
    assert SourceModel(source, {}, {}).read_json("config.json") is not None


def test_structure_parser_keeps_a_bad_utf8_string_for_comparison(tmp_path):
    artifact = tmp_path / "x.gguf"
    artifact.write_bytes(gguf_bytes(honest_kvs()))
    assert read_layout(artifact).metadata["general.name"] == "tiny"
    assert safetensors_bytes({"a": 1}).startswith(struct.pack("<Q", 8))
