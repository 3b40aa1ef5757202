"""Item 14: the CLI's exit codes are a contract. An internal error is 3 (never 1, the NO-GO code), with
one line on stderr and the traceback only on request; a bad --format is a usage error (2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import edge.cli
from edge.cli import EXIT_CANNOT_RUN, EXIT_GO, EXIT_INTERNAL, EXIT_NO_GO
from service.cli import app
from service.cli import app as service_app
from tests.fuzz.hostile import write_honest_pair


def _boom(*_args: object, **_kwargs: object) -> None:
    raise RuntimeError("boom\nsecond line")


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    monkeypatch.setattr(edge.cli, "load_policy", _boom)
    monkeypatch.delenv("CONVGATE_DEBUG", raising=False)
    source, artifact = write_honest_pair(tmp_path)
    return ["verify", "--source", str(source), "--artifact", str(artifact), "--gates", "1",
            "--cache-dir", str(tmp_path / "cache")]


def test_exit_codes_are_distinct():
    assert len({EXIT_GO, EXIT_NO_GO, EXIT_CANNOT_RUN, EXIT_INTERNAL}) == 4
    assert EXIT_INTERNAL == 3


@pytest.mark.parametrize("cli", [app, service_app], ids=["engine", "service"])
def test_an_internal_error_exits_3_with_one_line_and_no_traceback(broken, cli):
    result = CliRunner().invoke(cli, broken)
    assert result.exit_code == EXIT_INTERNAL, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == ["convgate: internal error, not a verdict: RuntimeError: boom second line (--debug shows the "
                     "traceback)"]
    assert "Traceback" not in result.output


def test_debug_flag_or_env_prints_the_traceback(broken, monkeypatch):
    with_flag = CliRunner().invoke(app, [*broken, "--debug"])
    assert with_flag.exit_code == EXIT_INTERNAL and "Traceback" in with_flag.output
    monkeypatch.setenv("CONVGATE_DEBUG", "1")
    with_env = CliRunner().invoke(app, broken)
    assert with_env.exit_code == EXIT_INTERNAL and "Traceback" in with_env.output


def test_a_verdict_is_not_an_internal_error(tmp_path):
    source, artifact = write_honest_pair(tmp_path)
    result = CliRunner().invoke(app, ["verify", "--source", str(source), "--artifact", str(artifact), "--gates", "1",
                                      "--cache-dir", str(tmp_path / "cache")])
    assert result.exit_code in (EXIT_GO, EXIT_NO_GO), result.output
    assert result.output.rstrip().splitlines()[-1] in ("GO", "NO-GO")


def test_report_with_an_unknown_format_is_a_usage_error():
    result = CliRunner().invoke(service_app, ["report", "some-id", "--format", "x", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == EXIT_CANNOT_RUN, result.output
    assert "--format" in result.output and "Traceback" not in result.output
    assert not isinstance(result.exception, KeyError)
