"""GET /v1/verifications/{id}/attestation: the verdict's signed DSSE envelope, signed on first request
and identical on every later one; GET /v1/verifications/{id}/signature: the OpenSSF Model Signing
signature of a GO artifact. Visible to whoever may read the verification."""

from __future__ import annotations

import json
from typing import Annotated, Literal
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from sqlalchemy.orm import Session

from engine.formats.artifact_files import uri_name
from service.api import access_log
from service.api.deps import Principal, SettingsDep, caller
from service.api.endpoints import VerificationId, _visible
from service.api.errors import ERRORS
from service.api.units import one_trip
from service.attestations import KeyFileError, attestation_for
from service.attestations.issue import vsa_for
from service.attestations.oms import model_signature_for
from service.attestations.vsa import SummaryUnavailableError
from service.auth import READ_OWN_OR_ANY

DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
ENVELOPE = {"schema": {"type": "object", "required": ["payload", "payloadType", "signatures"]}}
router = APIRouter(prefix="/v1", responses=ERRORS)


@router.get("/verifications/{verification_id}/attestation", response_model=None, responses={
    200: {"description": "the DSSE envelope of an in-toto Statement; `Accept: " + DSSE_MEDIA_TYPE + "` names it so",
          "content": {"application/json": ENVELOPE, DSSE_MEDIA_TYPE: ENVELOPE}},
    409: {**ERRORS[400], "description": "no verdict yet: nothing to attest"},
    503: {**ERRORS[400], "description": "the signing key cannot be loaded"}})
async def read_attestation(verification_id: VerificationId, request: Request, settings: SettingsDep,
                           principal: Annotated[Principal, caller(READ_OWN_OR_ANY)],
                           predicate: Annotated[Literal["convgate", "vsa"], Query(
                               description="convgate: our predicate, every digest an auditor re-checks; vsa: the "
                                           "SLSA Verification Summary (https://slsa.dev/verification_summary/v1) "
                                           "a policy engine reads")] = "convgate") -> Response:
    media = DSSE_MEDIA_TYPE if DSSE_MEDIA_TYPE in request.headers.get("accept", "") else "application/json"

    def attest(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        try:
            envelope = (attestation_for if predicate == "convgate" else vsa_for)(session, settings, verification)
        except KeyFileError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"attestation signing key: {exc}") from exc
        except SummaryUnavailableError as exc:  # a report too old to name its policy's hash
            raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from exc
        if envelope is None:
            raise HTTPException(status.HTTP_409_CONFLICT,
                                f"no verdict yet (state {verification.state}): attestations are signed verdicts")
        access_log.record(session, request, principal, "read_attestation", verification.id)
        return Response(json.dumps(envelope, separators=(",", ":")), media_type=media)
    return await one_trip(request, attest)


BUNDLE = {"schema": {"type": "object", "required": ["mediaType", "verificationMaterial", "dsseEnvelope"]}}


@router.get("/verifications/{verification_id}/signature", response_model=None, responses={
    200: {"description": "the OpenSSF Model Signing signature of the verified artifact (a Sigstore bundle), signed "
                         "with the operator's model-signing key: `model_signing verify key <artifact> --signature "
                         "<this> --public_key <convgate keys show --model-signing>` accepts the released file",
          "content": {"application/json": BUNDLE}},
    409: {**ERRORS[400], "description": "no GO verdict: only what convgate found good is signed"},
    503: {**ERRORS[400], "description": "the model-signing key cannot be loaded"}})
async def read_model_signature(verification_id: VerificationId, request: Request,
                               settings: SettingsDep,
                               principal: Annotated[Principal, caller(READ_OWN_OR_ANY)]) -> Response:
    def sign(session: Session) -> Response:
        verification = _visible(session, verification_id, principal)
        bundle = model_signature_for(session, settings, verification)  # KeyFileError: a 503 (api/errors.py)
        if bundle is None:
            raise HTTPException(status.HTTP_409_CONFLICT, f"no GO verdict (state {verification.state}, verdict "
                                f"{verification.verdict_result or 'none'}): only a GO artifact is signed")
        access_log.record(session, request, principal, "read_model_signature", verification.id)
        name = uri_name(verification.artifact_uri) or "artifact"
        return Response(bundle, media_type="application/json",
                        headers={"Content-Disposition": f'attachment; filename="{quote(name)}.sig"'})
    return await one_trip(request, sign)
