"""The `convgate` command: `verify` (the engine, local) plus the service commands."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn
from rich.table import Table

from edge.cli import (
    EXIT_CANNOT_RUN,
    EXIT_GO,
    EXIT_NO_GO,
    exits_3_on_internal_error,
    read_json_named,
    read_lines_named,
    verify_command,
)
from edge.redact import install_log_redaction
from engine.errors import UsageError
from service.attestations.cli import attestation_app, keys_app
from service.auth import Role, digest, new_secret
from service.client import ApiError, Client
from service.config import Settings

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Verify model conversions before they ship.")
app.command("verify")(verify_command)
tokens_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API tokens.")
worker_app = typer.Typer(no_args_is_help=True, help="The Job entrypoint.")
db_app = typer.Typer(no_args_is_help=True, help="Database migrations.")
app.add_typer(tokens_app, name="tokens")
app.add_typer(worker_app, name="worker")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(attestation_app, name="attestation")
stderr = Console(stderr=True)
# Where a container's writers point (the images and the Job manifest set them under the pod's scratch volume).
SCRATCH_DIRS_ENV = ("TMPDIR", "HOME", "XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME", "TRITON_CACHE_DIR",
                    "NUMBA_CACHE_DIR", "MPLCONFIGDIR", "CONVGATE_CACHE", "CONVGATE_CACHE_DIR")


@app.callback()
def _create_scratch_dirs() -> None:
    """A pod's scratch volume starts empty while TMPDIR, HOME and the library caches point into it: create
    those directories before any command runs, or on a read-only root filesystem `tempfile` finds no usable
    directory and llama.cpp's runner cannot start."""
    for name in SCRATCH_DIRS_ENV:
        value = os.environ.get(name)
        if value:
            with contextlib.suppress(OSError):
                Path(value).mkdir(parents=True, exist_ok=True)


UrlOpt = Annotated[str | None, typer.Option(help="server URL (or CONVGATE_URL)")]
TokenOpt = Annotated[str | None, typer.Option(help="bearer token (or CONVGATE_TOKEN)")]


def _start_logging() -> None:
    """What every long-running command does first: hide URI secrets in every log line (httpx logs each
    request's full URL, a callback's `?sig=` included), then log at INFO."""
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")


def _factory(settings: Settings):
    from service.persistence.db import make_engine, session_factory

    busy = settings.sqlite_busy_timeout_seconds
    return session_factory(make_engine(settings.database_url, busy_timeout_seconds=busy))


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Migrate the database (CONVGATE_DATABASE_URL) to `revision`."""
    from service.persistence.migrate import upgrade

    upgrade(Settings().database_url, revision)


@db_app.command("grant-worker")
def db_grant_worker(
    group: Annotated[str, typer.Option(help="the NOLOGIN group role workers act as")] = "convgate_worker",
    login: Annotated[str | None, typer.Option(help="create (or re-key) this login in the group and print "
                                                   "its URL, for the worker Secret")] = None,
    admin_url: Annotated[str | None, typer.Option(envvar="CONVGATE_ADMIN_DATABASE_URL",
                                                  help="a URL with CREATEROLE, only for --login")] = None,
) -> None:
    """Least privilege for Kubernetes workers (Postgres): with --login, an administrator's URL creates the
    roles; then the service's own URL (the functions' owner) grants EXECUTE on the worker functions
    and checks the group can touch no table. Idempotent: run it again after every upgrade."""
    from service.persistence.worker_role import create_worker_login, grant_worker

    service_url = Settings().database_url
    if login is not None:
        if not admin_url:
            raise typer.BadParameter("--login needs --admin-url (or CONVGATE_ADMIN_DATABASE_URL)",
                                     param_hint="--admin-url")
        sys.stdout.write(create_worker_login(admin_url, service_url, group, login).url + "\n")
    grant_worker(service_url, group)


@tokens_app.command("create")
def tokens_create(name: str, role: Annotated[Role, typer.Option()]) -> None:
    """Create a token; the secret is printed once and stored only as a digest."""
    from service.persistence import tokens
    from service.persistence.db import transaction

    secret = new_secret()
    with transaction(_factory(Settings())) as session:
        tokens.add_token(session, name, role.value, digest(secret))
    sys.stdout.write(secret + "\n")


@tokens_app.command("revoke")
def tokens_revoke(name: str) -> None:
    from service.persistence import tokens
    from service.persistence.db import transaction

    with transaction(_factory(Settings())) as session:
        if not tokens.revoke_token(session, name):
            stderr.print(f"no active token named {name!r}")
            raise typer.Exit(1)


@tokens_app.command("list")
def tokens_list() -> None:
    from service.persistence import tokens

    with _factory(Settings())() as session:
        table = Table("name", "role", "created", "revoked")
        for token in tokens.list_tokens(session):
            table.add_row(token.name, token.role, str(token.created_at), str(token.revoked_at or ""))
    Console().print(table)


@worker_app.command("run")
def worker_run(verification_id: Annotated[str, typer.Option()],
               attempt: Annotated[int, typer.Option(help="the attempt this worker was launched for", min=1)],
               worker_name: Annotated[str | None, typer.Option()] = None,
               shard: Annotated[int | None, typer.Option(
                   help="this worker's shard of gate 1 (default: an Indexed Job's JOB_COMPLETION_INDEX)", min=0,
               )] = None) -> None:
    """Run one verification attempt and store its verdict (what a pool process or a Job runs)."""
    from service.job import run_verification

    _start_logging()
    name = worker_name or f"{os.uname().nodename}:{os.getpid()}"
    index = shard if shard is not None else int(os.environ.get("JOB_COMPLETION_INDEX", "0"))
    raise typer.Exit(run_verification(Settings(), verification_id, name, attempt, shard=index))


@app.command("serve")
def serve(host: str = "127.0.0.1", port: int = 8080,
          migrate: Annotated[bool, typer.Option(help="migrate the database to head first")] = True,
          workers: Annotated[int, typer.Option(min=1, max=64, help="API processes on the one port (above 1, "
                                               "this process runs only the background loops)")] = 1) -> None:
    """Run the API (and, for the local dispatcher, the worker pool)."""
    from service.api.serving import serve as run_server
    from service.persistence.migrate import upgrade

    _start_logging()  # before the migration, the dispatch loop and the callback loop can log anything
    settings = Settings()
    if migrate:
        upgrade(settings.database_url)
    run_server(settings, host=host, port=port, workers=workers)  # uvicorn, deadlines for slow clients


def _wait(client: Client, verification_id: str) -> dict:
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  console=stderr, transient=True, disable=not stderr.is_terminal) as progress:
        task = progress.add_task("queued", total=None)
        while True:
            current = client.get(verification_id)
            stage = current.get("progress") or {}
            progress.update(task, description=f"{current['state']} {stage.get('stage', '')}",
                            completed=stage.get("done", 0), total=stage.get("total") or None)
            if current["state"] in ("completed", "failed", "cancelled"):
                return current
            time.sleep(0.5)


@app.command("submit")
@exits_3_on_internal_error
def submit(source: str, artifact: str, sha256: Annotated[str, typer.Option()],
           url: UrlOpt = None, token: TokenOpt = None, kind: str = "auto", policy: Path | None = None,
           texts: Path | None = None, idempotency_key: str | None = None,
           imatrix: Annotated[str | None, typer.Option(help="URI of the importance matrix the artifact was "
                                                            "quantized with (needs --imatrix-sha256)")] = None,
           imatrix_sha256: str | None = None,
           wait: Annotated[bool, typer.Option(help="wait for the verdict with a progress display")] = False) -> None:
    """Submit a verification to the service; with --wait, exit 0 for GO and 1 for NO-GO."""
    body: dict = {"source_uri": source, "artifact_uri": artifact, "artifact_sha256": sha256, "kind": kind}
    if imatrix is not None or imatrix_sha256 is not None:
        body |= {"imatrix_uri": imatrix, "imatrix_sha256": imatrix_sha256}  # the API refuses one without the other
    try:
        if policy is not None:
            body["policy"] = read_json_named(policy, "--policy")
        if texts is not None:
            body["texts"] = list(read_lines_named(texts, "--texts"))
    except UsageError as exc:  # exit 2, never 1: the README's NO-GO
        stderr.print(f"convgate: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_CANNOT_RUN) from exc
    client = Client(url, token)
    try:
        created = client.submit(body, idempotency_key)
        sys.stdout.write(f"{created['id']}\n")
        if not wait:
            return
        final = _wait(client, created["id"])
    except ApiError as exc:
        stderr.print(f"convgate: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from exc
    verdict = final.get("verdict") or final["state"].upper()
    sys.stdout.write(f"report: {created['links']['report']}\n{verdict}\n")
    raise typer.Exit(EXIT_GO if verdict == "GO" else EXIT_NO_GO if verdict == "NO-GO" else EXIT_CANNOT_RUN)


@app.command("status")
@exits_3_on_internal_error
def status(verification_id: str, url: UrlOpt = None, token: TokenOpt = None) -> None:
    try:
        sys.stdout.write(json.dumps(Client(url, token).get(verification_id), indent=2) + "\n")
    except ApiError as exc:
        stderr.print(f"convgate: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from exc


@app.command("report")
@exits_3_on_internal_error
def report(verification_id: str, url: UrlOpt = None, token: TokenOpt = None,
           output_format: Annotated[str, typer.Option("--format", help="json, markdown or html")] = "markdown") -> None:
    formats = {"json": "application/json", "markdown": "text/markdown", "html": "text/html"}
    if output_format not in formats:
        raise typer.BadParameter(f"{output_format!r} is not one of json, markdown, html", param_hint="--format")
    accept = formats[output_format]
    try:
        sys.stdout.write(Client(url, token).report(verification_id, accept) + "\n")
    except ApiError as exc:
        stderr.print(f"convgate: {exc}", markup=False)
        raise typer.Exit(EXIT_CANNOT_RUN) from exc


if __name__ == "__main__":
    app()
