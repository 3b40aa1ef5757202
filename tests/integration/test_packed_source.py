"""A packed low-bit source verified end to end: GGUF holding the decoded values is GO; one packed
code changed in the source makes it NO-GO on that tensor."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.numpy import load_file, save_file

from engine.formats import packed
from engine.formats.source import open_source
from tests.conftest import blocked_tensors, defect_copy, run_gate1

pytestmark = pytest.mark.slow
PACKED = "encoder.layer.0.attention.self.query.weight"


def packed_minilm(minilm, root, tamper: bool = False):
    shutil.copytree(minilm / "source", root, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = load_file(str(minilm / "source" / "model.safetensors"))
    weight = tensors.pop(PACKED)
    parts = packed.encode(weight, bits=4, group_size=32)
    if tamper:
        parts["qweight"][100] ^= 0x01
    tensors[f"{PACKED}.qweight"] = parts["qweight"]
    tensors[f"{PACKED}.scales"] = parts["scales"]
    spec = {PACKED: {"bits": 4, "group_size": 32, "shape": list(weight.shape)}}
    save_file(tensors, str(root / "model.safetensors"), metadata={packed.PACKED_METADATA_KEY: json.dumps(spec)})
    return root


def test_packed_source_go_and_tampered_code_no_go(minilm, tmp_path):
    source = packed_minilm(minilm, tmp_path / "packed")
    decoded = open_source(source).tensors[PACKED]
    values = decoded.widen(decoded.as_rows()).reshape(-1)
    artifact = defect_copy(minilm / "minilm-F32.gguf", tmp_path, "blk.0.attn_q.weight",
                           lambda raw: raw.view("<f4").__setitem__(slice(None), values))
    report = run_gate1(source, artifact)
    assert report.verdict == "GO", report.blockers
    row = next(r for r in report.gates["storage"].details["tensors"] if r["gguf_name"] == "blk.0.attn_q.weight")
    assert row["source_dtype"] == "PACKED4" and row["check"] == "bit-exact"

    tampered = packed_minilm(minilm, tmp_path / "tampered", tamper=True)
    report = run_gate1(tampered, artifact)
    assert blocked_tensors(report, "tensor.value_mismatch") == {"blk.0.attn_q.weight"}
