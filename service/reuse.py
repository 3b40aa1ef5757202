"""Verdict reuse: when may an earlier verdict stand for a new submission without running anything.

A verdict is a function of the bytes verified, the thresholds and the verifier. A submission may reuse
one only when all three are known to be the same:

- the bytes: every input is pinned by content. The artifact (and an imatrix) by sha256; the source only
  as an `hf://owner/repo@<commit>` URI, since a commit names every file's content. A `file://` source is
  a path whose files can change, and release files are unpinned `file://` paths: such a submission is
  never reused (the service would have to read every file to know its digest, which is the run itself).
  The artifact's URI is not part of the key: its sha256 is what was verified, wherever it came from.
- the thresholds: the policy's sha256.
- the verifier: on Kubernetes, the worker image reference (`kubernetes.image`; the service cannot see
  inside it, so use an immutable reference, `name@sha256:...`); on the local pool the workers are this
  very installation, so the earlier report's `environment` (convgate, llama-cpp-python, transformers,
  gguf, torch, ... versions) must equal what is installed now. An API-only replica (`dispatcher: none`)
  does not know its workers and reuses nothing.

The key holds the first three (the local pool's versions are compared at lookup, against each candidate's
report). A run that ended without a verdict (failed, cancelled) is never reused; NO-GO is, like GO.

And the reader: a reused verdict carries the original's report and attestation, which name the original
submitter's URIs and texts. So it is shared only with principals allowed to read the original (its own
submitter, or a role that reads every verification); anyone else's identical submission runs. Rewriting
the copy to the new submission's URIs was the alternative, refused: the signed report would then
describe a run that never happened.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from edge.uri_policy import HF_URI
from engine.versions import package_version
from service.config import Settings
from service.fetching import public_request
from service.persistence import repository
from service.persistence import reuse as reuse_store
from service.persistence.models import Verification

# Not what was verified: where the artifact was fetched from, its announced size, a deployment choice
# (shards), and the callback.
OUTSIDE_THE_KEY = frozenset({"artifact_uri", "artifact_size", "shards", "callback_url"})
# Report environment entries that describe resources, not software: they do not change a verdict.
RESOURCES = frozenset({"threads"})


def _pinned(request: Mapping[str, Any]) -> bool:
    return HF_URI.match(request["source_uri"]) is not None and not request.get("release_files")


def _verifier(settings: Settings) -> dict[str, str] | None:
    if settings.dispatcher == "kubernetes":
        return {"image": settings.kubernetes.image}
    if settings.dispatcher == "local":
        return {"workers": "local"}
    return None


def reuse_key(settings: Settings, request: Mapping[str, Any], policy_sha256: str) -> str | None:
    """The sha256 every submission with the same pinned inputs, policy and verifier shares; None when
    an input is not pinned by content or the workers are unknown."""
    verifier = _verifier(settings)
    if verifier is None or not _pinned(request):
        return None
    material = {key: value for key, value in public_request(dict(request)).items() if key not in OUTSIDE_THE_KEY}
    canonical = json.dumps({"request": material, "policy": policy_sha256, "verifier": verifier}, sort_keys=True,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@functools.cache  # read once per process: the local pool's workers run this same installation
def _installed(name: str) -> str:
    if name == "python":
        return platform.python_version()
    return package_version(name) or "not installed"


def same_verifier(settings: Settings, environment: object) -> bool:
    """Whether a candidate's report (its `environment`, as stored) was written by the verifier that would
    run now. A report naming no convgate version proves nothing. On Kubernetes the key names the image."""
    if not isinstance(environment, Mapping):
        return False
    recorded = {name: value for name, value in environment.items() if name not in RESOURCES}
    if "convgate" not in recorded:
        return False
    if settings.dispatcher == "kubernetes":
        return True
    return all(_installed(name) == value for name, value in recorded.items())


def insert_or_reuse(session: Session, settings: Settings, *, fresh: bool, among: str | None, key: str | None,
                    **columns: Any) -> Verification | None:
    """Store a submission: born completed with an earlier verdict when one may stand for it (and `fresh`
    was not asked), else queued; None when the submitter already used the idempotency key. `key`: its
    `reuse_key`. `among`: only this submitter's verdicts may stand (None: any, for a principal who may read
    them all)."""
    found = None if key is None or fresh else reuse_store.reusable(
        session, key, functools.partial(same_verifier, settings), submitted_by=among)
    if found is not None:
        return reuse_store.insert_reused(session, found, reuse_key=key, **columns)
    return repository.insert_unless_known(session, reuse_key=key, **columns)
