"""What every fuzz target shares: the contract (only a `ConvgateError` may escape), a scratch honest
model to damage, and the atheris entry point.

A target is `one_input(data: bytes) -> None`. It must return normally or raise a `ConvgateError`
(a coded blocker or a usage error); any other exception is a crash, which the corpus replay test and
scripts/fuzz.py report.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

from engine.blockers import Blocker
from engine.errors import ConvgateError
from engine.formats.gguf_structure import read_layout
from engine.formats.source import open_source
from engine.gates.storage.gate import run_storage_gate
from engine.policy import Policy
from engine.report import GateResult, Report
from engine.summary import render_summary
from tests.fuzz.hostile import write_honest_pair

Target = Callable[[bytes], None]
ALLOWED = (ConvgateError,)
CORPUS = Path(__file__).resolve().parent / "corpus"


@cache
def scratch() -> Path:
    """A private directory for this process's files (removed at exit by the OS's tmp cleaning)."""
    return Path(tempfile.mkdtemp(prefix="convgate-fuzz-"))


def honest_copy(name: str) -> tuple[Path, Path]:
    """A fresh honest (source dir, GGUF) pair under the scratch directory, named `name`."""
    root = scratch() / name
    if root.exists():
        shutil.rmtree(root)
    return write_honest_pair(root)


def report_of(blockers: list[Blocker], gate: GateResult | None) -> str:
    """Serialise what gate 1 found the way the CLI does: the JSON report and the summary, both UTF-8."""
    report = Report(verdict="NO-GO" if blockers else "GO", blockers=blockers,
                    gates={"storage": gate} if gate else {}, policy={"values": {"version": "fuzz"}, "sha256": ""},
                    artifact=None, files=[], not_verified=[], environment={}, timings={})
    document = report.model_dump_json()
    document.encode("utf-8")
    render_summary(report).encode("utf-8")
    return document


def gate1(source_dir: Path, artifact: Path) -> str:
    """Structure, source, gate 1 and the report writer, as the engine chains them."""
    layout = read_layout(artifact)
    source = open_source(source_dir)
    result, blockers = run_storage_gate(artifact, layout, source, Policy())
    return report_of(blockers, result)


def main(target: Target) -> None:
    """`python -m fuzz.<name> [libFuzzer flags] [corpus dirs]` under atheris."""
    import atheris

    atheris.instrument_all()

    def one(data: bytes) -> None:
        with contextlib.suppress(*ALLOWED):
            target(data)

    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
