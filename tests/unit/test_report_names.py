"""A report names files by the URIs they were asked by, never by where the server keeps them (issue 22,
item 4): a source fetched from the hub lives in the server's content store, and its path there told every
reader of the report (and of a reused copy) the server's cache layout."""

from __future__ import annotations

import json

from engine.policy import Policy
from engine.verification import LocalInputs, VerifyRequest, verify

SOURCE_URI = "hf://org/model@" + "a" * 40
ARTIFACT_URI = "hf://org/model-gguf@" + "b" * 40 + "/model.gguf"


def test_the_report_names_source_files_by_their_uri_not_the_store_path(tmp_path):
    store = tmp_path / "server-cache" / "store"
    source = store / "snapshot"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "tokenizer.json").write_text("{}")
    artifact = store / "blob"
    artifact.write_bytes(b"GGUF")
    inputs = LocalInputs(source=source, source_uri=SOURCE_URI, artifact=artifact, artifact_uri=ARTIFACT_URI)
    report = verify(VerifyRequest(expected_sha256="0" * 64), inputs, Policy())
    text = json.dumps(report.model_dump(mode="json"))
    assert str(tmp_path) not in text
    assert [f.uri for f in report.files] == [ARTIFACT_URI, f"{SOURCE_URI}/config.json",
                                            f"{SOURCE_URI}/sub/tokenizer.json"]


def test_a_missing_artifact_is_named_by_its_uri(tmp_path):
    source = tmp_path / "server-cache" / "snapshot"
    source.mkdir(parents=True)
    inputs = LocalInputs(source=source, source_uri=SOURCE_URI, artifact=tmp_path / "server-cache" / "gone",
                         artifact_uri=ARTIFACT_URI)
    report = verify(VerifyRequest(), inputs, Policy())
    text = json.dumps(report.model_dump(mode="json"))
    assert str(tmp_path) not in text and ARTIFACT_URI in text
