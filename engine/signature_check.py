"""The publisher's signatures of a verification's inputs (OpenSSF Model Signing, `engine/oms.py`): a
signature is worth something only if a key the operator trusts made it and it covers every file the
verification read, with the bytes that were read. Anything less is NO-GO (`source.signature_invalid`,
`artifact.signature_invalid`), as is a policy that requires a source signature and got none.

The digests compared are the ones the engine already took of every file it read, so a file cannot
change between the check and its use without the verification's own digests showing it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engine.blockers import Blocker
from engine.digests import digest_file
from engine.formats.artifact_files import uri_name
from engine.oms import SINGLE_FILE, SignatureInvalidError, SignedManifest, load_public_key, read_signature, uncovered
from engine.policy import Policy
from engine.report import FileDigest, SignatureCheck

Subject = Literal["source", "artifact"]


@dataclass(frozen=True, slots=True)
class SignatureInput:
    """One signature to check: the local file, the URI the report names it by, its pinned sha256."""

    of: Subject
    path: Path
    uri: str
    expected_sha256: str | None = None


@dataclass(frozen=True, slots=True)
class SignatureOutcome:
    blockers: list[Blocker]
    checks: list[SignatureCheck]  # the signatures that verified and covered everything read
    files: list[FileDigest]  # the signature files themselves, digested like every input


def _relative(files: Sequence[FileDigest], root_uri: str) -> dict[str, str]:
    prefix = root_uri.rstrip("/") + "/"
    return {f.uri[len(prefix):]: f.sha256 for f in files if f.uri.startswith(prefix)}


def _artifact_files(pieces: Sequence[FileDigest]) -> dict[str, str]:
    """A single-file artifact is signed as "."; a split one as the directory of its shards."""
    if len(pieces) == 1:
        return {SINGLE_FILE: pieces[0].sha256}
    return {uri_name(piece.uri): piece.sha256 for piece in pieces}


def _one(given: SignatureInput, read: dict[str, str],
         trusted: Sequence[str]) -> tuple[FileDigest | None, SignatureCheck | Blocker]:
    """The signature file's digest (None when there is no file) and what checking it found."""
    code = f"{given.of}.signature_invalid"
    if not given.path.is_file():
        return None, Blocker(code=code, gate="input",
                             why=f"the {given.of}'s signature {given.uri} is not a readable file")
    digest = digest_file(given.path, given.uri)
    if given.expected_sha256 is not None and given.expected_sha256.lower() != digest.sha256:
        return digest, Blocker(code=code, gate="input", why=f"the {given.of}'s signature has sha256 {digest.sha256}, "
                                                            f"expected {given.expected_sha256}; not used")
    try:
        keys = [load_public_key(pem) for pem in trusted]
        manifest: SignedManifest = read_signature(given.path.read_bytes(), keys)
    except (SignatureInvalidError, ValueError) as exc:
        return digest, Blocker(code=code, gate="input", why=f"the {given.of}'s signature: {exc}")
    if problems := uncovered(manifest, read):
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        return digest, Blocker(code=code, gate="input", why=f"the {given.of}'s signature does not cover what was "
                                                            f"read: {shown}")
    return digest, SignatureCheck(of=given.of, uri=given.uri, sha256=digest.sha256, signer=manifest.signer,
                                  files=len(read))


def check_signatures(signatures: Sequence[SignatureInput], trusted: Sequence[str], policy: Policy, *,
                     pieces: Sequence[FileDigest], source_files: Sequence[FileDigest],
                     source_uri: str) -> SignatureOutcome:
    """Every given signature checked against the files read; the policy's requirement of a source one."""
    outcome = SignatureOutcome(blockers=[], checks=[], files=[])
    read = {"source": _relative(source_files, source_uri), "artifact": _artifact_files(pieces)}
    for given in signatures:
        digest, result = _one(given, read[given.of], trusted)
        if digest is not None:
            outcome.files.append(digest)
        if isinstance(result, Blocker):
            outcome.blockers.append(result)
        else:
            outcome.checks.append(result)
    if policy.require_source_signature and not any(given.of == "source" for given in signatures):
        outcome.blockers.append(Blocker(code="source.signature_required", gate="input",
                                        why="the policy requires the source's publisher signature, and none was given"))
    return outcome
