"""file:// has roots, and no name read from a model's own files leaves its directory: a shard index
or a sentence-transformers module naming an absolute path or `../` is refused by the source reader;
release files pass the same root check in the worker as at submission; the engine itself fetches
nothing (it is a pure function of local files)."""

from __future__ import annotations

import ast
import json
import struct
from pathlib import Path

import pytest

from edge.download import FetchPolicy
from edge.inputs import InputUris, fetch_and_verify
from edge.store import ContentStore
from edge.uri_policy import UriPolicy
from engine.errors import SourceError
from engine.formats.source import open_source
from engine.policy import Policy
from engine.verification import VerifyRequest
from service.config import Settings
from service.schemas import SubmitRequest
from service.verifications import SubmissionError, admit

REPO = Path(__file__).resolve().parents[2]


def tiny_safetensors(path: Path) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


def model_dir(root: Path) -> Path:
    model = root / "m"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"architectures": ["BertModel"]}))
    tiny_safetensors(model / "model.safetensors")
    return model


@pytest.mark.parametrize("shard", ["/etc/passwd", "../outside.safetensors", "sub/../../outside.safetensors",
                                   "..\\outside.safetensors"])
def test_a_shard_index_naming_a_path_outside_the_model_is_refused(tmp_path, shard):
    model = model_dir(tmp_path)
    tiny_safetensors(tmp_path / "outside.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(SourceError, match="outside the model directory") as info:
        open_source(model)
    assert info.value.code == "source.index_mismatch"


def test_a_plain_shard_index_still_opens(tmp_path):
    model = model_dir(tmp_path)
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model.safetensors"}}))
    assert set(open_source(model).tensors) == {"w"}


@pytest.mark.parametrize("module_path", ["../outside", "/etc"])
def test_a_pooling_module_outside_the_model_is_refused(tmp_path, module_path):
    model = model_dir(tmp_path)
    (model / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "0", "path": module_path, "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text("{}")
    if module_path == "/etc":  # an absolute module path is read relative to the model, never from /etc
        assert open_source(model).read_json("/etc/config.json") is None
        return
    with pytest.raises(SourceError, match="outside the model directory") as info:
        open_source(model)
    assert info.value.code == "source.bad_file"


@pytest.fixture
def layout(tmp_path) -> tuple[Path, Path]:
    root, outside = tmp_path / "models", tmp_path / "private"
    model_dir(root)
    (root / "m.gguf").write_bytes(b"GGUF-not-really")
    outside.mkdir()
    (outside / "notes.txt").write_text("private")
    return root, outside


@pytest.mark.parametrize("release", ["{outside}/notes.txt", "{root}/../private/notes.txt", "{root}/link.txt",
                                     "https://8.8.8.8/notes.txt"])
def test_release_files_are_checked_in_the_worker_as_at_submission(tmp_path, layout, release):
    root, outside = layout
    (root / "link.txt").symlink_to(outside / "notes.txt")
    uri = release.format(outside=outside.as_uri(), root=root.as_uri()) if "{" in release else release
    if uri.startswith("/"):
        uri = Path(uri).as_uri()
    fetch = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(root,)))
    uris = InputUris(source=(root / "m").as_uri(), artifact=(root / "m.gguf").as_uri(), release_files=(uri,))
    report = fetch_and_verify(VerifyRequest(gates=frozenset({1, 3})), uris, Policy(), fetch,
                              ContentStore(tmp_path / "cache"))
    assert report.verdict == "NO-GO"
    assert [(b.code, b.gate) for b in report.blockers] == [("artifact.fetch_failed", "input")]
    assert "outside the allowed file roots" in report.blockers[0].why or "not a local file" in report.blockers[0].why
    settings = Settings(database_url="sqlite://", allow_file_uris=True, file_roots=(root,))
    with pytest.raises(SubmissionError, match=r"outside the allowed file roots|release files are file://"):
        admit(settings, SubmitRequest(source_uri=(root / "m").as_uri(), artifact_uri=(root / "m.gguf").as_uri(),
                                      artifact_sha256="a" * 64, release_files=[uri]))


def test_release_files_inside_the_roots_reach_the_engine(tmp_path, layout):
    root, _ = layout
    (root / "README.md").write_text("release notes")
    fetch = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(root,)))
    uris = InputUris(source=(root / "m").as_uri(), artifact=(root / "m.gguf").as_uri(),
                     release_files=((root / "README.md").as_uri(),))
    report = fetch_and_verify(VerifyRequest(gates=frozenset({1})), uris, Policy(), fetch, ContentStore(tmp_path / "c"))
    # the artifact is not a GGUF: a structure blocker, not a refusal of the release file
    assert report.artifact is not None and report.artifact.uri == (root / "m.gguf").resolve().as_uri()
    assert not any(b.code == "artifact.fetch_failed" for b in report.blockers)


def test_the_engine_imports_nothing_that_fetches():
    """engine/ is the pure engine: it imports neither the edge nor a network library (its CLI is edge/cli.py)."""
    banned = ("edge", "httpx", "httpcore", "requests", "huggingface_hub", "socket", "urllib.request")
    offenders = []
    for path in sorted((REPO / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] in banned
                          or n in banned]
    assert offenders == []


@pytest.mark.parametrize("of", ["source", "artifact"])
def test_a_signature_outside_the_roots_or_absent_is_no_go_under_its_own_code(tmp_path, layout, of):
    """issue 25: a publisher's signature is fetched like the artifact; one that cannot be had is no evidence."""
    root, outside = layout
    (outside / "s.sig").write_text("{}")
    fetch = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(root,)))
    for uri, why in (((outside / "s.sig").as_uri(), "outside the allowed file roots"),
                     ((root / "absent.sig").as_uri(), "absent.sig")):
        uris = InputUris(source=(root / "m").as_uri(), artifact=(root / "m.gguf").as_uri(), **{f"{of}_signature": uri})
        report = fetch_and_verify(VerifyRequest(gates=frozenset({1})), uris, Policy(), fetch,
                                  ContentStore(tmp_path / "cache"))
        assert report.verdict == "NO-GO" and [(b.code, b.gate) for b in report.blockers] == [
            (f"{of}.signature_invalid", "input")]
        assert report.blockers[0].why.startswith(f"the {of}'s signature: ") and why in report.blockers[0].why
