"""`convgate` command line. Printing and exit codes live here and nowhere else.

Exit codes: 0 GO, 1 NO-GO, 2 could not run (usage error, unreadable source or artifact path).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from worker.engine import SourceUnavailableError, VerifyRequest, verify
from worker.errors import UsageError
from worker.fetch import ContentStore, FetchPolicy, local_path
from worker.policy import load_policy
from worker.summary import render_summary

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Verify model conversions before they ship.")
stderr = Console(stderr=True)
EXIT_GO, EXIT_NO_GO, EXIT_CANNOT_RUN = 0, 1, 2


@app.callback()
def _main() -> None:
    """convgate: verifies Hugging Face -> GGUF conversions."""


def _check_local(value: str, what: str) -> str:
    """Local paths must exist (else exit 2); remote URIs are fetched by the engine."""
    parsed = urlparse(value)
    if parsed.scheme in ("", "file"):
        path = local_path(value)
        if not path.exists():
            raise UsageError(f"{what} {value} does not exist")
        return path.resolve().as_uri()
    if parsed.scheme not in ("https", "hf"):
        raise UsageError(f"{what} scheme {parsed.scheme!r} is not supported (path, file://, https://, hf://)")
    return value


def default_cache() -> Path:
    return Path(os.environ.get("CONVGATE_CACHE", Path.home() / ".cache" / "convgate"))


def _parse_gates(value: str) -> frozenset[int]:
    try:
        gates = frozenset(int(part) for part in value.split(",") if part.strip())
    except ValueError as exc:
        raise UsageError(f"--gates takes numbers like 1,2,3, not {value!r}") from exc
    if not gates or not gates <= {1, 2, 3}:
        raise UsageError(f"--gates must name gates among 1,2,3, not {value!r}")
    return gates


def _read_texts(path: Path | None) -> tuple[str, ...] | None:
    if path is None:
        return None
    try:
        return tuple(line for line in path.read_text(encoding="utf-8").splitlines() if line)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read --texts {path}: {exc}") from exc


class _ProgressBars:
    """Rich progress bars on a TTY, nothing otherwise (CI logs stay readable)."""

    def __init__(self) -> None:
        self.progress = Progress(
            TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeRemainingColumn(), console=stderr, transient=True, disable=not stderr.is_terminal,
        )
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, label: str, done: int, total: int) -> None:
        if label not in self.tasks:
            self.tasks[label] = self.progress.add_task(label, total=total)
        self.progress.update(self.tasks[label], completed=done, total=total)


@app.command("verify")
def verify_command(
    source: Annotated[str, typer.Option(help="Hugging Face model directory (path or file:// URI)")],
    artifact: Annotated[str, typer.Option(help="converted GGUF (path or file:// URI)")],
    sha256: Annotated[str | None, typer.Option(help="expected sha256 of the artifact")] = None,
    policy: Annotated[Path | None, typer.Option(help="policy JSON file (default policy otherwise)")] = None,
    texts: Annotated[Path | None, typer.Option(help="UTF-8 text file, one text per line")] = None,
    report: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    gates: Annotated[str, typer.Option(help="gates to run, e.g. 1 or 1,2,3")] = "1,2,3",
    kind: Annotated[str, typer.Option(help="auto, embedding or causal-lm")] = "auto",
    release: Annotated[list[Path] | None, typer.Option(help="another file of the release package")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="content-addressed download cache")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the JSON report instead of the summary")] = False,
) -> None:
    """Run the verification gates on one conversion and print a verdict."""
    try:
        if kind not in ("auto", "embedding", "causal-lm"):
            raise UsageError(f"--kind must be auto, embedding or causal-lm, not {kind!r}")
        request = VerifyRequest(
            source_uri=_check_local(source, "source"), artifact_uri=_check_local(artifact, "artifact"),
            expected_sha256=sha256, gates=_parse_gates(gates), texts=_read_texts(texts), kind=kind,
            release_files=tuple(release or ()),
        )
        chosen_policy = load_policy(policy)
        store = ContentStore(cache_dir or default_cache())
        bars = _ProgressBars()
        with bars.progress:
            result = verify(request, chosen_policy, store, FetchPolicy(), bars)
    except (UsageError, SourceUnavailableError) as exc:
        stderr.print(f"convgate: {exc}", markup=False, highlight=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from exc
    document = result.model_dump_json(indent=2)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(document + "\n", encoding="utf-8")
    if json_output:
        sys.stdout.write(document + "\n")
        sys.stdout.write(result.verdict + "\n")
    else:
        sys.stdout.write(render_summary(result) + "\n")
    raise typer.Exit(EXIT_GO if result.verdict == "GO" else EXIT_NO_GO)
