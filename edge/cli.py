"""`convgate verify`, the engine's command (registered on the one `convgate` command, service/cli.py).
Printing and exit codes live here and nowhere else.

Exit codes: 0 GO, 1 NO-GO, 2 could not run (usage error, unreadable source or artifact path),
3 internal error (a bug in convgate, never a verdict: one line on stderr, the traceback only with
--debug or CONVGATE_DEBUG=1).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, TypeVar, cast
from urllib.parse import urlparse

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from edge.download import FetchPolicy
from edge.errors import TransientFetchError
from edge.file_roots import OutsideRootsError, file_uri_path
from edge.inputs import InputUris, fetch_and_verify
from edge.redact import install_log_redaction
from edge.store import ContentStore
from edge.uri_policy import UriPolicy
from engine.errors import UsageError
from engine.gates.runtime.labelled_retrieval import LabelledSet, parse_labelled_set
from engine.oms import load_public_key
from engine.policy import load_policy
from engine.resources import ThreadSettingError, cpu_budget
from engine.summary import render_summary
from engine.verification import SourceUnavailableError, VerifyRequest

stderr = Console(stderr=True)
EXIT_GO, EXIT_NO_GO, EXIT_CANNOT_RUN, EXIT_INTERNAL = 0, 1, 2, 3
_Command = TypeVar("_Command", bound=Callable[..., None])


def exits_3_on_internal_error(command: _Command) -> _Command:
    """An unexpected exception is exit 3 with one line on stderr, so it is never read as NO-GO (typer's
    default for an uncaught exception is exit 1 with a traceback)."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        # typer's own usage errors (typer.BadParameter: its vendored click) and click's pass on as exit 2
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException, click.ClickException, KeyboardInterrupt):
            raise
        except Exception as exc:  # the one place every other exception is translated
            if kwargs.get("debug") or os.environ.get("CONVGATE_DEBUG"):
                traceback.print_exc()
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
            stderr.print(f"convgate: internal error, not a verdict: {message} (--debug shows the traceback)",
                         markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_INTERNAL) from exc

    return cast(_Command, run)


# The CLI reads what its user can read (file roots are the service's setting); https:// goes through
# the same transport as the service's: public addresses only, checked where it connects.
CLI_FETCH_POLICY = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(Path("/"),)))


def _check_local(value: str, what: str) -> str:
    """Local paths must exist (else exit 2); remote URIs are fetched at the edge (`edge.inputs`)."""
    parsed = urlparse(value)
    if parsed.scheme in ("", "file"):
        try:
            path = file_uri_path(value)
        except OutsideRootsError as exc:
            raise UsageError(f"{what}: {exc}") from exc
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


def read_named(path: Path, option: str) -> str:
    """A file an option names, as UTF-8 text (`convgate verify` and `convgate submit` both read theirs here):
    one that cannot be read is a usage error, exit 2, never an exit code a verdict has."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {option} {path}: {exc.strerror or type(exc).__name__}") from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read {option} {path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc


def read_json_named(path: Path, option: str) -> Any:
    text = read_named(path, option)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"cannot read {option} {path}: not JSON ({exc})") from exc


def read_lines_named(path: Path, option: str) -> tuple[str, ...]:
    """One text per non-empty line."""
    return tuple(line for line in read_named(path, option).splitlines() if line)


def _read_texts(path: Path | None, option: str = "--texts") -> tuple[str, ...] | None:
    return None if path is None else read_lines_named(path, option)


SET_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")


def _read_labelled_set(path: Path | None) -> LabelledSet | None:
    """`--labelled-set FILE`: a JSON labelled retrieval set in the built-in one's format."""
    if path is None:
        return None
    document = read_json_named(path, "--labelled-set")
    try:
        return parse_labelled_set(document, f"submitted ({path.name})")
    except ValueError as exc:  # not a labelled set
        raise UsageError(f"--labelled-set {path}: {exc}") from exc


def _read_text_sets(values: list[str] | None) -> dict[str, tuple[str, ...]] | None:
    """`--text-set NAME=FILE`, repeatable: one slice of gate 2's measures per named set."""
    if not values:
        return None
    sets: dict[str, tuple[str, ...]] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or len(name) > 64 or not set(name) <= SET_NAME_CHARS or name.startswith("probe"):
            raise UsageError(f"--text-set takes NAME=FILE with a lower-case NAME of letters, digits, - and _ "
                             f"(not starting with 'probe'), not {value!r}")
        if name in sets:
            raise UsageError(f"--text-set {name} is given twice")
        sets[name] = _read_texts(Path(path), f"--text-set {name}") or ()
    return sets


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


def _check_thread_setting() -> None:
    """A bad CONVGATE_THREADS stops the run before any download, not in the middle of gate 2."""
    try:
        cpu_budget()
    except ThreadSettingError as exc:
        raise UsageError(str(exc)) from exc


def _read_signers(paths: Sequence[Path]) -> tuple[str, ...]:
    """The publishers' public keys, each refused now if it is not an OMS key (ECDSA P-256/384/521 PEM)."""
    keys = []
    for path in paths:
        try:
            pem = path.read_text(encoding="ascii")
            load_public_key(pem)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--trusted-signer {path}: {exc}") from exc
        keys.append(pem)
    return tuple(keys)


@exits_3_on_internal_error
def verify_command(
    source: Annotated[str, typer.Option(
        help="Hugging Face model: a directory, file:// URI, hf://org/model@commit or https:// URI")],
    artifact: Annotated[str, typer.Option(
        help="converted GGUF: a path, file:// or https:// URI; a gguf-split by its first shard, the others beside it")],
    sha256: Annotated[str | None, typer.Option(help="expected sha256 of the artifact")] = None,
    shard_sha256: Annotated[list[str] | None, typer.Option(
        help="a split's expected sha256 per shard, in order from the first; repeatable")] = None,
    policy: Annotated[Path | None, typer.Option(help="policy JSON file (default policy otherwise)")] = None,
    texts: Annotated[Path | None, typer.Option(help="UTF-8 text file, one text per line")] = None,
    text_set: Annotated[list[str] | None, typer.Option(
        help="NAME=FILE: a named text set (a language, a domain), measured as its own slice; repeatable")] = None,
    labelled_set: Annotated[Path | None, typer.Option(
        help="embeddings: a JSON labelled retrieval set (queries, passages, relevant ids) measured instead of the "
             "built-in one")] = None,
    report: Annotated[Path | None, typer.Option(help="write the JSON report here")] = None,
    gates: Annotated[str, typer.Option(help="gates to run, e.g. 1 or 1,2,3")] = "1,2,3",
    kind: Annotated[str, typer.Option(help="auto, embedding, causal-lm or reranker")] = "auto",
    release: Annotated[list[Path] | None, typer.Option(help="another file of the release package")] = None,
    imatrix: Annotated[str | None, typer.Option(
        help="the importance matrix the artifact was quantized with (llama.cpp GGUF or .dat; path or URI)")] = None,
    imatrix_sha256: Annotated[str | None, typer.Option(help="expected sha256 of the importance matrix")] = None,
    source_signature: Annotated[str | None, typer.Option(
        help="the source publisher's OpenSSF Model Signing signature (path or URI): NO-GO unless it verifies with a "
             "--trusted-signer key and covers every source file read")] = None,
    artifact_signature: Annotated[str | None, typer.Option(
        help="the artifact publisher's OpenSSF Model Signing signature, checked the same way")] = None,
    trusted_signer: Annotated[list[Path] | None, typer.Option(
        help="a publisher's ECDSA public key (PEM) a signature may verify with; repeatable")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="content-addressed download cache")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print the JSON report instead of the summary")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="print the traceback of an internal error (exit 3)")] = False,
) -> None:
    """Run the verification gates on one conversion and print a verdict."""
    try:
        if kind not in ("auto", "embedding", "causal-lm", "reranker"):
            raise UsageError(f"--kind must be auto, embedding, causal-lm or reranker, not {kind!r}")
        _check_thread_setting()
        uris = InputUris(source=_check_local(source, "source"), artifact=_check_local(artifact, "artifact"),
                         release_files=tuple(path.resolve().as_uri() for path in release or ()),
                         imatrix=_check_local(imatrix, "imatrix") if imatrix is not None else None,
                         source_signature=_check_local(source_signature, "source signature")
                         if source_signature is not None else None,
                         artifact_signature=_check_local(artifact_signature, "artifact signature")
                         if artifact_signature is not None else None)
        request = VerifyRequest(expected_sha256=sha256, gates=_parse_gates(gates), texts=_read_texts(texts),
                                text_sets=_read_text_sets(text_set), kind=kind, imatrix_sha256=imatrix_sha256,
                                shard_sha256=tuple(shard_sha256 or ()),
                                trusted_signers=_read_signers(trusted_signer or ()),
                                labelled_set=_read_labelled_set(labelled_set))
        chosen_policy = load_policy(policy)
        store = ContentStore(cache_dir or default_cache())
        install_log_redaction()
        bars = _ProgressBars()
        with bars.progress:
            result = fetch_and_verify(request, uris, chosen_policy, CLI_FETCH_POLICY, store, bars)
    except (UsageError, SourceUnavailableError, TransientFetchError) as exc:
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
