"""The same verdict as a SLSA Verification Summary Attestation (VSA v1), for tools that know no convgate.

convgate's own predicate (`statement.py`) carries everything an auditor re-checks; a VSA carries what
a policy engine or a registry asks of any verifier, in the shape SLSA defines for "a verifier checked
this artifact against this policy": who verified (`verifier.id`, versions), when, which resource, the
policy (a URI and its sha256: the policy's canonical hash, as in every report), the result and the
levels verified. Its subjects are the artifact alone (every shard of a split): a VSA
answers for the thing being admitted, while the source's files stay in convgate's own statement.

`verifiedLevels` names the gates that ran and passed (`CONVGATE_STORAGE_V1`, `…_RUNTIME_V1`,
`…_RELEASE_V1`): custom levels, which the VSA format allows beside SLSA's track levels. A NO-GO is
`FAILED` with no level. A policy engine admits an artifact when the VSA's signature verifies under the
operator's key, its subject digest is the artifact's, `verifier.id` is convgate's, the result is
`PASSED` and the levels it requires are listed.
"""

from __future__ import annotations

import json
import re
from datetime import UTC
from typing import Annotated, Any, Literal

from pydantic import Field

from engine.errors import ConvgateError
from engine.formats.artifact_files import other_shards_in
from service.attestations.statement import NOT_RECORDED, Attested, Digest, Subject, _Strict, statement_json

VSA_PREDICATE_TYPE = "https://slsa.dev/verification_summary/v1"
VERIFIER_ID = "https://convgate.dev/verifier/v1"
GATE_LEVELS = {"storage": "CONVGATE_STORAGE_V1", "runtime": "CONVGATE_RUNTIME_V1", "release": "CONVGATE_RELEASE_V1"}


class Verifier(_Strict):
    id: str
    version: dict[str, str]


class ResourceDescriptor(_Strict):
    uri: Annotated[str, Field(min_length=1)]
    digest: Digest


class VsaPredicate(_Strict):
    verifier: Verifier
    timeVerified: str  # noqa: N815 - the SLSA field names
    resourceUri: str  # noqa: N815
    policy: ResourceDescriptor
    inputAttestations: list[ResourceDescriptor]  # noqa: N815 - the publishers' signatures checked on the inputs
    verificationResult: Literal["PASSED", "FAILED"]  # noqa: N815
    verifiedLevels: list[str]  # noqa: N815
    slsaVersion: Literal["1.0"] = "1.0"  # noqa: N815


class VsaStatement(_Strict):
    type: Literal["https://in-toto.io/Statement/v1"] = Field(alias="_type")
    subject: Annotated[list[Subject], Field(min_length=1)]
    predicateType: Literal["https://slsa.dev/verification_summary/v1"]  # noqa: N815
    predicate: VsaPredicate


def policy_uri(origin: str, version: str | None) -> str:
    """A URN naming whose thresholds these were: `urn:convgate:policy:configured:default:2026.12-1`."""
    return f"urn:convgate:policy:{origin}:{version or NOT_RECORDED.replace(' ', '-')}"


class SummaryUnavailableError(ConvgateError, ValueError):
    """A stored verdict no VSA can honestly summarise (its report records no policy hash)."""

    code = "attestation.summary_unavailable"


def build_vsa(attested: Attested) -> VsaStatement:
    """The VSA of one stored verdict. A report without its policy's hash cannot say which policy it was
    held to, so it gets no VSA (a made-up digest would be worse than none)."""
    report = attested.report
    artifact = report.get("artifact") or {"uri": attested.artifact_uri, "sha256": attested.artifact_sha256}
    passed = report["verdict"] == "GO"
    policy = report.get("policy") or {}
    if not isinstance(policy.get("sha256"), str) or not re.fullmatch(r"[0-9a-f]{64}", policy["sha256"]):
        raise SummaryUnavailableError(f"verification {attested.verification_id}: its report records no policy hash")
    environment = report.get("environment") or {}
    versions = {name: str(environment[name]) for name in ("convgate", "llama-cpp-python", "transformers", "gguf")
                if name in environment}
    levels = [GATE_LEVELS[name] for name, gate in (report.get("gates") or {}).items()
              if passed and name in GATE_LEVELS and gate.get("status") == "passed"]
    predicate = VsaPredicate(
        verifier=Verifier(id=VERIFIER_ID, version=versions or {"convgate": NOT_RECORDED}),
        timeVerified=attested.verdict_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), resourceUri=artifact["uri"],
        policy=ResourceDescriptor(uri=policy_uri(attested.policy_origin, (policy.get("values") or {}).get("version")),
                                  digest=Digest(sha256=policy["sha256"])),
        inputAttestations=[ResourceDescriptor(uri=signature["uri"], digest=Digest(sha256=signature["sha256"]))
                           for signature in report.get("signatures") or ()],
        verificationResult="PASSED" if passed else "FAILED", verifiedLevels=levels)
    return VsaStatement.model_validate({
        "_type": "https://in-toto.io/Statement/v1", "predicateType": VSA_PREDICATE_TYPE, "predicate": predicate,
        "subject": [Subject(name=entry["uri"], digest=Digest(sha256=entry["sha256"]))
                    for entry in (artifact, *_other_shards(artifact["uri"], report.get("files") or []))]})


def _other_shards(first_uri: str, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A split artifact's other shards: the report's files right after the first, named as its siblings."""
    after = files[1:]
    return [after[position] for position in other_shards_in(first_uri, [entry["uri"] for entry in after])]


def vsa_payload(statement: VsaStatement) -> bytes:
    """Sorted keys, no whitespace, like convgate's own statement: one statement, one payload to sign."""
    return json.dumps(statement_json(statement), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
