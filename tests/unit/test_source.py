"""Source reading: strict safetensors, shard index, pickle refusal, packed low-bit tensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from engine.errors import SourceError
from engine.formats import packed
from engine.formats.safetensors_strict import read_safetensors
from engine.formats.source import open_source


def raw_safetensors(path: Path, header: str, data: bytes) -> Path:
    encoded = header.encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def model_dir(tmp_path: Path, tensors: dict[str, np.ndarray], **files: str) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test"}))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def expect(code: str, call) -> SourceError:
    with pytest.raises(SourceError) as info:
        call()
    assert info.value.code == code, info.value.why
    return info.value


def test_duplicate_tensor_keys_are_refused(tmp_path):
    header = ('{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
              ' "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}')
    path = raw_safetensors(tmp_path / "dup.safetensors", header, b"\0" * 8)
    error = expect("source.duplicate_tensor", lambda: read_safetensors(path))
    assert error.tensor == "a"


@pytest.mark.parametrize(
    ("case", "header", "data"),
    [
        ("size mismatch", '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}', b"\0" * 4),
        ("offsets past end", '{"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}', b"\0" * 8),
        ("hole", '{"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', b"\0" * 8),
        ("unknown dtype", '{"a": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4),
        ("not json", "{nope", b""),
        ("metadata not strings", '{"__metadata__": {"a": 1}}', b""),
    ],
)
def test_malformed_safetensors_headers(tmp_path, case, header, data):
    path = raw_safetensors(tmp_path / "bad.safetensors", header, data)
    expect("source.bad_safetensors", lambda: read_safetensors(path))


def test_header_length_beyond_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    expect("source.bad_safetensors", lambda: read_safetensors(path))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_pickle_checkpoints_are_refused_unopened(tmp_path, suffix):
    root = model_dir(tmp_path, {"w": np.zeros(2, np.float32)})
    (root / f"pytorch_model{suffix}").write_bytes(b"\x80\x04 this would be a pickle")
    error = expect("source.unsafe_format", lambda: open_source(root))
    assert f"pytorch_model{suffix}" in error.why


def test_missing_config_and_weights(tmp_path):
    expect("source.missing", lambda: open_source(tmp_path))
    (tmp_path / "config.json").write_text("[1]")
    expect("source.bad_config", lambda: open_source(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    expect("source.missing", lambda: open_source(tmp_path))


def sharded(tmp_path: Path, weight_map: dict[str, str]) -> Path:
    (tmp_path / "config.json").write_text("{}")
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "s1.safetensors"))
    save_file({"b": np.ones(2, np.float32)}, str(tmp_path / "s2.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


def test_index_that_agrees_with_shards_opens(tmp_path):
    source = open_source(sharded(tmp_path, {"a": "s1.safetensors", "b": "s2.safetensors"}))
    assert sorted(source.tensors) == ["a", "b"]


@pytest.mark.parametrize(
    "weight_map",
    [
        {"a": "s2.safetensors", "b": "s2.safetensors"},
        {"a": "s1.safetensors"},
        {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"},
        {"a": "s1.safetensors", "b": "s3.safetensors"},
    ],
    ids=["wrong shard", "tensor not indexed", "indexed tensor absent", "missing shard"],
)
def test_index_disagreeing_with_shards(tmp_path, weight_map):
    expect("source.index_mismatch", lambda: open_source(sharded(tmp_path, weight_map)))


def test_same_tensor_in_two_shards(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    save_file({"a": np.zeros(2, np.float32)}, str(tmp_path / "s1.safetensors"))
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "s2.safetensors"))
    expect("source.duplicate_tensor", lambda: open_source(tmp_path))


def packed_file(tmp_path: Path, values: np.ndarray, bits: int, group: int, declared: dict | None = None) -> Path:
    parts = packed.encode(values, bits, group)
    spec = declared or {"bits": bits, "group_size": group, "shape": list(values.shape)}
    save_file({"w.qweight": parts["qweight"], "w.scales": parts["scales"]}, str(tmp_path / "model.safetensors"),
              metadata={packed.PACKED_METADATA_KEY: json.dumps({"w": spec})})
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packed_tensor_decodes_from_header_metadata(tmp_path, bits):
    rng = np.random.default_rng(bits)
    values = rng.standard_normal((8, 64)).astype(np.float32)
    source = open_source(packed_file(tmp_path, values, bits, 32))
    tensor = source.tensors["w"]
    assert tensor.dtype == f"PACKED{bits}" and tensor.shape == (8, 64)
    decoded = tensor.widen(tensor.as_rows())
    step = np.abs(values.reshape(-1, 32)).max(axis=1, keepdims=True) / max((1 << (bits - 1)) - 1, 1)
    assert np.all(np.abs(decoded.reshape(-1, 32) - values.reshape(-1, 32)) <= step * 1.5 + 1e-6)


@pytest.mark.parametrize(
    "declared",
    [
        {"bits": 3, "group_size": 32, "shape": [8, 64]},
        {"bits": 4, "group_size": 64, "shape": [8, 64]},
        {"bits": 4, "group_size": 32, "shape": [8, 32]},
        {"bits": 4, "shape": [8, 64]},
    ],
    ids=["bits disagree", "group size disagrees", "shape disagrees", "incomplete"],
)
def test_packed_metadata_disagreeing_with_bytes_is_refused(tmp_path, declared):
    values = np.ones((8, 64), np.float32)
    expect("source.packed_mismatch", lambda: open_source(packed_file(tmp_path, values, 4, 32, declared)))
