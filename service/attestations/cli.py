"""`convgate keys show` and `convgate attestation verify`: printing and exit codes live here, the
checks in the library modules. Verification is offline: an envelope file, trusted public keys, and
optionally local copies of the attested files."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from service.attestations.envelope import AttestationRefusedError, Verified, verify_envelope
from service.attestations.keys import KeyFileError, keyid_of, load_public_key, public_pem, trusted_public_keys
from service.attestations.oms import model_signing_key, rotated_public_keys
from service.attestations.oms import public_pem as oms_public_pem
from service.attestations.statement import Statement, statement_json
from service.attestations.subjects import check_subjects
from service.attestations.tensors import check_tensors
from service.attestations.vsa import VsaStatement
from service.config import Settings

EXIT_VERIFIED, EXIT_REFUSED, EXIT_CANNOT_CHECK = 0, 1, 2
keys_app = typer.Typer(no_args_is_help=True, help="The keys that sign attestations (Ed25519) and model signatures.")
attestation_app = typer.Typer(no_args_is_help=True, help="Check signed attestations offline.")
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def _fail(message: str, code: int) -> typer.Exit:
    sys.stderr.write(f"convgate: {message}\n")
    return typer.Exit(code)


@keys_app.command("show")
def keys_show(as_json: JsonOpt = False, model_signing: Annotated[bool, typer.Option(
        "--model-signing", help="the key that signs OpenSSF Model Signing signatures of GO artifacts instead "
                                "(give its public half to `model_signing verify key --public_key`)")] = False) -> None:
    """The active signing key's public half (PEM) and key id, plus the other trusted public keys;
    on the embedded default the key is generated on first use."""
    settings = Settings()
    try:
        if model_signing:  # ids as the library's key hint: the sha256 of the PEM
            algorithm = "ecdsa-p256"
            active = _with_id(oms_public_pem(model_signing_key(settings).public_key()))
            trusted = [_with_id(oms_public_pem(key)) for key in rotated_public_keys(settings)]
        else:
            algorithm = "ed25519"
            keys = trusted_public_keys(settings)
            active, trusted = (keyid_of(keys[0]), public_pem(keys[0])), [(keyid_of(k), public_pem(k)) for k in keys[1:]]
    except KeyFileError as exc:
        raise _fail(str(exc), EXIT_CANNOT_CHECK) from exc
    if as_json:
        document = {"keyid": active[0], "algorithm": algorithm, "public_key_pem": active[1],
                    "trusted": [{"keyid": keyid, "public_key_pem": pem} for keyid, pem in trusted]}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return
    sys.stdout.write(f"keyid: {active[0]}\n{active[1]}")
    for keyid, _pem in trusted:
        sys.stdout.write(f"also trusted: {keyid}\n")


def _with_id(pem: str) -> tuple[str, str]:
    return hashlib.sha256(pem.encode()).hexdigest(), pem


def _envelope(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise _fail(f"cannot read {path}: {exc.strerror or exc}", EXIT_CANNOT_CHECK) from exc
    except ValueError as exc:
        raise _fail(f"refused: {path} is not JSON ({exc})", EXIT_REFUSED) from exc


@attestation_app.command("verify")
def attestation_verify(
    envelope_file: Annotated[Path, typer.Argument(metavar="FILE", help="a DSSE envelope (JSON)")],
    key: Annotated[list[Path], typer.Option(help="a trusted Ed25519 public key (PEM); repeat to trust several")],
    subject: Annotated[list[Path] | None, typer.Option(
        help="a local file whose sha256 must equal the subject it is named as; repeatable")] = None,
    tensors: Annotated[list[Path] | None, typer.Option(
        help="a local GGUF whose every tensor's data sha256 must equal the statement's; repeatable")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the signature (by any trusted key whose id the envelope names), the statement's schema,
    the given local files against their subjects and the given GGUFs tensor by tensor.
    Exit 0 verified, 1 refused, 2 cannot check."""
    try:
        trusted = [load_public_key(path) for path in key]
    except KeyFileError as exc:
        raise _fail(str(exc), EXIT_CANNOT_CHECK) from exc
    document = _envelope(envelope_file)
    try:
        verified = verify_envelope(document, trusted)
    except AttestationRefusedError as exc:
        if as_json:
            sys.stdout.write(json.dumps({"verified": False, "problems": exc.reasons}) + "\n")
        raise _fail(f"refused: {exc}", EXIT_REFUSED) from exc
    statement = verified.statement
    problems = check_subjects(statement, subject or [])
    for gguf in tensors or []:
        problems += (check_tensors(statement, gguf) if isinstance(statement, Statement) else
                     [f"{gguf}: a verification summary (SLSA VSA) names no tensors; check convgate's own attestation"])
    if as_json:
        sys.stdout.write(json.dumps({"verified": not problems, "problems": problems, "keyid": verified.keyid,
                                     "subjects_checked": len(subject or []), "ggufs_checked": len(tensors or []),
                                     "statement": statement_json(statement)}, indent=2) + "\n")
    for problem in problems:
        sys.stderr.write(f"convgate: refused: {problem}\n")
    if problems:
        raise typer.Exit(EXIT_REFUSED)
    if not as_json:
        sys.stdout.write(_summary(verified, len(subject or []), bool(tensors)))


def _summary(verified: Verified, subjects: int, tensors: bool) -> str:
    statement = verified.statement
    if isinstance(statement, VsaStatement):
        summary = statement.predicate
        return (f"verified: SLSA verification summary {summary.verificationResult} for {summary.resourceUri} "
                f"(levels: {', '.join(summary.verifiedLevels) or 'none'}), signed by {verified.keyid}, "
                f"{subjects} local file(s) match their subjects\n")
    predicate = statement.predicate
    tensor_count = len(predicate.tensor_data_sha256) if tensors else 0
    return (f"verified: {predicate.verdict} for verification {predicate.verification_id}, signed by "
            f"{verified.keyid}, {subjects} local file(s) match their subjects, {tensor_count} tensor(s) match\n")
