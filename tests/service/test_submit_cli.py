"""`convgate submit` sends what the API takes: the importance matrix travels with its digest."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

import service.cli
from service.cli import app


class _RecordingClient:
    bodies: list[dict[str, Any]] = []  # noqa: RUF012 - shared by the instances one test creates

    def __init__(self, url: str | None, token: str | None) -> None:
        pass

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        self.bodies.append(body)
        return {"id": "v-1", "links": {"report": "/v1/verifications/v-1/report"}}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    _RecordingClient.bodies = []
    monkeypatch.setattr(service.cli, "Client", _RecordingClient)
    return _RecordingClient.bodies


BASE = ["submit", "hf://o/m@" + "a" * 40, "https://example.org/m.gguf", "--sha256", "b" * 64]


def test_an_importance_matrix_is_submitted_with_its_digest(sent):
    result = CliRunner().invoke(app, [*BASE, "--imatrix", "https://example.org/imatrix.gguf",
                                      "--imatrix-sha256", "c" * 64])
    assert result.exit_code == 0, result.output
    assert sent[0]["imatrix_uri"] == "https://example.org/imatrix.gguf" and sent[0]["imatrix_sha256"] == "c" * 64


def test_without_an_importance_matrix_the_body_has_no_imatrix_fields(sent):
    assert CliRunner().invoke(app, BASE).exit_code == 0
    assert not {"imatrix_uri", "imatrix_sha256"} & set(sent[0])


@pytest.mark.parametrize(("option", "content"), [
    ("--policy", b"{not json"), ("--policy", b"\xff\xfe"), ("--texts", b"\xff\xfe not utf-8"),
    ("--policy", None), ("--texts", None)])
def test_an_unreadable_policy_or_texts_file_is_could_not_run_never_no_go(sent, tmp_path, option, content):
    """Issue 35: these exited 1, which the README defines as NO-GO. A file the user named that cannot be read
    is exit 2 with one line naming it, and nothing is submitted."""
    named = tmp_path / "given"
    if content is not None:
        named.write_bytes(content)
    result = CliRunner().invoke(app, [*BASE, option, str(named)])
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert f"convgate: cannot read {option} {named}:" in result.output
    assert "Traceback" not in result.output and sent == []


def test_an_unexpected_error_in_submit_is_exit_3_not_a_verdict(monkeypatch, sent):
    def broken(self, body, idempotency_key=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(_RecordingClient, "submit", broken)
    result = CliRunner().invoke(app, BASE)
    assert result.exit_code == 3 and "internal error, not a verdict: RuntimeError: a bug" in result.output
