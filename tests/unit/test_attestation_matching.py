"""Issue 13 item 1, the recipient's side: local files find their subject by the end of their path (a
URI's percent-escapes undone, ties refused), and a GGUF is checked tensor by tensor by name, so the
same tensors in another header order still match, in chunks of any size."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.formats.gguf_structure import read_layout
from service.attestations import Statement, check_subjects, check_tensors
from service.attestations import tensors as tensor_module
from service.attestations.statement import STATEMENT_TYPE
from service.attestations.subjects import subject_for
from tests.gguf_bytes import GGUFBytes

PREDICATE = {"verification_id": "v", "reused_from": None, "verdict": "GO", "verdict_at": "2026-11-30T00:00:00Z",
             "blocker_codes": [], "gates": {}, "policy": {"sha256": "p", "values": {}, "origin": "inline"},
             "not_verified": [],
             "versions": {"convgate": "1", "llama.cpp": "2", "transformers": "3", "gguf": "4"},
             "tensor_data_sha256": {}, "tensors_without_digest": [], "signing_keyid": "0" * 64}


def statement(subjects: dict[str, str], tensors: dict[str, str] | None = None) -> Statement:
    return Statement.model_validate({
        "_type": STATEMENT_TYPE, "predicateType": "https://convgate.dev/verification/v1",
        "subject": [{"name": name, "digest": {"sha256": sha}} for name, sha in subjects.items()],
        "predicate": {**PREDICATE, "tensor_data_sha256": tensors or {}}})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_longest_matching_path_end_wins_and_ties_are_refused(tmp_path):
    plain = write(tmp_path / "copy" / "source" / "config.json", b"plain")
    pooling = write(tmp_path / "copy" / "source" / "1_Pooling" / "config.json", b"pooling")
    attested = statement({"file:///m/source/config.json": sha(b"plain"),
                          "file:///m/source/1_Pooling/config.json": sha(b"pooling"),
                          "hf://org/model@abc/Read%20Me.md": sha(b"readme"),
                          "weights#1.bin": sha(b"hash sign")})
    assert [subject_for(attested, p).name for p in (plain, pooling)] == [  # type: ignore[union-attr]
        "file:///m/source/config.json", "file:///m/source/1_Pooling/config.json"]
    lone = write(tmp_path / "elsewhere" / "config.json", b"plain")
    assert subject_for(attested, lone) == (f"{lone}: several subjects end with 'config.json' "
                                           "(file:///m/source/config.json, file:///m/source/1_Pooling/config.json)")
    readme = write(tmp_path / "Read Me.md", b"readme")
    hashed = write(tmp_path / "weights#1.bin", b"hash sign")
    assert check_subjects(attested, [plain, pooling, readme, hashed]) == []


def test_every_file_is_reported_not_just_the_first(tmp_path):
    attested = statement({"file:///m/a.bin": sha(b"a"), "file:///m/b.bin": sha(b"b")})
    stranger = write(tmp_path / "stranger.bin", b"x")
    missing = tmp_path / "a.bin"
    changed = write(tmp_path / "b.bin", b"B")
    problems = check_subjects(attested, [stranger, missing, changed])
    assert problems == [f"{stranger}: no subject is named 'stranger.bin'", f"{missing}: not a readable file",
                        f"{changed}: sha256 {sha(b'B')} differs from subject file:///m/b.bin ({sha(b'b')})"]


def gguf(tmp_path: Path, name: str, *specs: tuple[str, int]) -> Path:
    return write(tmp_path / name, GGUFBytes().with_f32_tensors(*specs).build())


def stored(path: Path) -> dict[str, str]:
    data = path.read_bytes()
    return {t.name: sha(data[t.offset:t.offset + t.nbytes]) for t in read_layout(path).tensors}


def test_the_header_order_does_not_matter_and_chunks_of_any_size_agree(tmp_path, monkeypatch):
    forward = gguf(tmp_path, "forward.gguf", ("a", 8), ("b", 40), ("c", 3))
    reordered = gguf(tmp_path, "reordered.gguf", ("c", 3), ("a", 8), ("b", 40))
    assert forward.read_bytes() != reordered.read_bytes()
    attested = statement({"file:///m/forward.gguf": sha(forward.read_bytes())}, stored(forward))
    assert check_tensors(attested, reordered) == []
    monkeypatch.setattr(tensor_module, "CHUNK_BYTES", 7)
    assert check_tensors(attested, reordered) == []


def test_extra_changed_and_missing_tensors_are_each_named(tmp_path):
    honest = gguf(tmp_path, "honest.gguf", ("a", 8), ("b", 40), ("c", 3))
    attested = statement({"file:///m/honest.gguf": sha(honest.read_bytes())}, stored(honest))
    other = gguf(tmp_path, "other.gguf", ("d", 2), ("a", 8), ("c", 4))
    problems = check_tensors(attested, other)
    changed = stored(other)["c"]
    assert problems == [f"{other}: tensor d is not in the statement",
                        f"{other}: tensor c data sha256 {changed} differs from the statement's {stored(honest)['c']}",
                        f"{other}: tensor b is missing"]


def test_a_file_that_ends_inside_a_tensor_or_is_no_gguf_is_refused(tmp_path):
    honest = gguf(tmp_path, "honest.gguf", ("a", 8))
    assert tensor_module.tensor_sha256(honest, 0, honest.stat().st_size + 1) is None
    assert tensor_module.tensor_sha256(honest, 4, 8) == sha(honest.read_bytes()[4:12])
    junk = write(tmp_path / "junk.gguf", b"GGUF")
    attested = statement({"file:///m/honest.gguf": sha(honest.read_bytes())}, stored(honest))
    assert check_tensors(attested, junk)[0].startswith(f"{junk}: not a valid GGUF")
    assert check_tensors(statement({"file:///m/h": sha(b"")}), honest) == [
        f"{honest}: the statement carries no tensor digests to check against"]


@pytest.mark.parametrize("size", [1, 6, 7, 8, 15])
def test_tensor_digests_stream_in_chunks(tmp_path, monkeypatch, size):
    data = bytes(range(40))
    path = write(tmp_path / "raw.bin", data)
    monkeypatch.setattr(tensor_module, "CHUNK_BYTES", 7)
    assert tensor_module.tensor_sha256(path, 3, size) == sha(data[3:3 + size])


def test_a_file_that_shrinks_while_read_is_named(tmp_path, monkeypatch):
    honest = gguf(tmp_path, "honest.gguf", ("a", 8))
    attested = statement({"file:///m/honest.gguf": sha(honest.read_bytes())}, stored(honest))
    monkeypatch.setattr(tensor_module, "tensor_sha256", lambda *_: None)
    assert check_tensors(attested, honest) == [f"{honest}: the file ends inside tensor a"]
