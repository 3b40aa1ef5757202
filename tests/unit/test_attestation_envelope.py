"""Issue 13 item 1: a verdict's in-toto Statement in a DSSE envelope, Ed25519-signed. Every field is
covered by the signature or the schema (each tampering is refused), several keys may be trusted at
once, and the statement names the key that signed it."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from service.attestations import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    AttestationRefusedError,
    Attested,
    Predicate,
    SigningKey,
    build_statement,
    check_subjects,
    sign_payload,
    sign_statement,
    verify_envelope,
)
from tests.unit.attestation_reports import TENSORS, report, write_files

MOMENT = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def attested(tmp_path: Path, **report_options: Any) -> Attested:
    files = write_files(tmp_path)
    produced = report(files, **report_options)
    return Attested(verification_id="0b5f3f1e-0000-4000-8000-000000000001", report=produced, verdict_at=MOMENT,
                    policy_origin="configured:default", artifact_uri="https://hub.example/submitted.gguf",
                    artifact_sha256="f" * 64)  # used only when the report has no artifact


def payload_of(envelope: dict[str, Any]) -> dict[str, Any]:
    return json.loads(base64.b64decode(envelope["payload"]))


def with_payload(envelope: dict[str, Any], statement: dict[str, Any]) -> dict[str, Any]:
    forged = copy.deepcopy(envelope)
    forged["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return forged


@pytest.fixture
def key() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
def signed(tmp_path: Path, key: SigningKey) -> dict[str, Any]:
    return sign_statement(build_statement(attested(tmp_path), key.keyid), key)


def test_the_statement_names_every_file_the_verdict_and_each_tensor_digest(tmp_path, key):
    facts = attested(tmp_path)
    statement = payload_of(sign_statement(build_statement(facts, key.keyid), key))
    assert statement["_type"] == STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == PREDICATE_TYPE
    subjects = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    assert subjects == {f["uri"]: f["sha256"] for f in facts.report["files"]}
    assert statement["subject"][0]["name"] == facts.report["artifact"]["uri"]  # the artifact first
    for path in write_files(tmp_path).all:
        assert subjects[path.absolute().as_uri()] == hashlib.sha256(path.read_bytes()).hexdigest()
    predicate = statement["predicate"]
    assert predicate["verification_id"] == facts.verification_id and predicate["reused_from"] is None
    assert predicate["verdict"] == "GO" and predicate["blocker_codes"] == []
    assert predicate["gates"] == {"storage": "passed", "runtime": "passed", "release": "not_run"}
    assert predicate["policy"] == {"sha256": "a" * 64, "values": {"version": "v1", "tie_ulps": 4},
                                   "origin": "configured:default"}
    assert predicate["not_verified"] == facts.report["not_verified"]
    assert predicate["versions"] == {"convgate": "0.1.0", "llama.cpp": "llama-cpp-python 0.3.36",
                                     "transformers": "4.57.6", "gguf": "0.19.0"}
    assert predicate["tensor_data_sha256"] == {n: hashlib.sha256(d).hexdigest() for n, d in TENSORS.items()}
    assert list(predicate["tensor_data_sha256"]) == sorted(TENSORS)
    assert predicate["tensors_without_digest"] == []
    assert predicate["signing_keyid"] == key.keyid
    assert predicate["verdict_at"] == "2026-11-30T12:00:00Z"


def test_the_header_order_of_tensors_does_not_change_the_payload(tmp_path, key):
    forward = sign_statement(build_statement(attested(tmp_path / "a"), key.keyid), key)
    backward = sign_statement(build_statement(attested(tmp_path / "a", reverse=True), key.keyid), key)
    assert forward == backward


def test_a_no_go_names_its_blockers_and_missing_facts_are_said_to_be_missing(tmp_path, key):
    facts = attested(tmp_path, verdict="NO-GO", with_digest=False, environment={"python": "3.11"})
    predicate = build_statement(facts, key.keyid).predicate
    assert predicate.verdict == "NO-GO" and predicate.blocker_codes == ["tensor.value_mismatch"]
    assert predicate.tensor_data_sha256 == {} and predicate.tensors_without_digest == sorted(TENSORS)
    assert set(predicate.versions.model_dump(by_alias=True).values()) == {"not recorded in the report"}


def test_versions_policy_and_time_take_what_the_report_has(tmp_path, key, monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # the local zone must not leak into the statement
    time.tzset()
    try:
        facts = attested(tmp_path, environment={"llama.cpp": "b6500", "llama-cpp-python": "0.3.36"})
        facts.report["policy"] = {}
        moment = datetime(2026, 11, 30, 14, 0, tzinfo=timezone(timedelta(hours=2)))
        predicate = build_statement(Attested(**{**facts.__dict__, "verdict_at": moment}), key.keyid).predicate
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert predicate.versions.llama_cpp == "b6500"
    assert predicate.policy.sha256 == "not recorded in the report" and predicate.policy.values == {}
    assert predicate.verdict_at == "2026-11-30T12:00:00Z"


def test_a_reused_verdict_names_the_run_that_produced_it(tmp_path, key):
    facts = Attested(**{**attested(tmp_path).__dict__, "reused_from": "0b5f3f1e-0000-4000-8000-00000000000a"})
    assert build_statement(facts, key.keyid).predicate.reused_from == "0b5f3f1e-0000-4000-8000-00000000000a"


def test_an_unfetched_artifact_is_named_by_the_submitted_digest(tmp_path, key):
    facts = attested(tmp_path)
    unfetched = Attested(**{**facts.__dict__, "report": {**facts.report, "artifact": None, "files": []},
                            "artifact_uri": "https://hub.example/m.gguf", "artifact_sha256": "c" * 64})
    subjects = build_statement(unfetched, key.keyid).subject
    assert [(s.name, s.digest.sha256) for s in subjects] == [("https://hub.example/m.gguf", "c" * 64)]


def test_a_signed_envelope_verifies_and_names_its_key(signed, key):
    assert signed["payloadType"] == PAYLOAD_TYPE == "application/vnd.in-toto+json"
    assert [s["keyid"] for s in signed["signatures"]] == [key.keyid]
    assert key.keyid == hashlib.sha256(key.public_raw).hexdigest()
    verified = verify_envelope(signed, [key.public])
    assert verified.keyid == key.keyid and verified.statement.predicate.verdict == "GO"


def _flip_payload_byte(envelope):
    raw = bytearray(base64.b64decode(envelope["payload"]))
    raw[len(raw) // 2] ^= 0x01
    return {**envelope, "payload": base64.b64encode(bytes(raw)).decode()}


def _flip_signature_bit(envelope):
    sig = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    sig[0] ^= 0x80
    return {**envelope, "signatures": [{**envelope["signatures"][0], "sig": base64.b64encode(bytes(sig)).decode()}]}


def _edit_statement(edit):
    def forge(envelope):
        statement = payload_of(envelope)
        edit(statement)
        return with_payload(envelope, statement)
    return forge


def _set_keyid(keyid):
    def forge(envelope):
        return {**envelope, "signatures": [{**envelope["signatures"][0], "keyid": keyid}]}
    return forge


ENVELOPE_TAMPERING = {
    "payload bytes": _flip_payload_byte,
    "payloadType": lambda e: {**e, "payloadType": "application/json"},
    "keyid (unknown)": _set_keyid("0" * 64),
    "signature": _flip_signature_bit,
    "no signature": lambda e: {**e, "signatures": []},
    "subject digest": _edit_statement(lambda s: s["subject"][1]["digest"].update(sha256="d" * 64)),
    "subject name": _edit_statement(lambda s: s["subject"][0].update(name="file:///elsewhere.gguf")),
    "subject dropped": _edit_statement(lambda s: s["subject"].pop()),
    "_type": _edit_statement(lambda s: s.update(_type="https://in-toto.io/Statement/v0.1")),
    "predicateType": _edit_statement(lambda s: s.update(predicateType="https://slsa.dev/provenance/v1")),
}


@pytest.mark.parametrize("forge", ENVELOPE_TAMPERING.values(), ids=ENVELOPE_TAMPERING.keys())
def test_every_envelope_field_is_covered(signed, key, forge):
    with pytest.raises(AttestationRefusedError):
        verify_envelope(forge(copy.deepcopy(signed)), [key.public])


def _changed(value: Any) -> Any:
    """A different value of the same JSON type (a forger keeps the schema and changes the facts)."""
    if value is None:
        return "0b5f3f1e-0000-4000-8000-000000000000"
    if isinstance(value, str):
        return "NO-GO" if value == "GO" else ("e" * 64 if len(value) == 64 else value + "x")
    if isinstance(value, list):
        return [*value, "tensor.value_mismatch"]
    if isinstance(value, dict):
        return {**value, "extra": "x"} if value else {"extra": "x"}
    raise AssertionError(f"no change for {value!r}")


@pytest.mark.parametrize("field", sorted(Predicate.model_fields))
def test_every_predicate_field_is_covered_by_the_signature(signed, key, field):
    statement = payload_of(signed)
    name = Predicate.model_fields[field].alias or field
    statement["predicate"][name] = _changed(statement["predicate"][name])
    with pytest.raises(AttestationRefusedError, match="signature"):
        verify_envelope(with_payload(signed, statement), [key.public])


def test_the_keyid_of_another_trusted_key_does_not_verify(signed, key):
    other = SigningKey.generate()
    with pytest.raises(AttestationRefusedError, match="signature"):
        verify_envelope(_set_keyid(other.keyid)(signed), [key.public, other.public])


SCHEMA_BREAKS = {
    "a predicate field missing": lambda s: s["predicate"].pop("verdict"),
    "an unknown predicate field": lambda s: s["predicate"].update(trust_me=True),
    "a verdict outside GO/NO-GO": lambda s: s["predicate"].update(verdict="MAYBE"),
    "a digest that is not sha256 hex": lambda s: s["subject"][0]["digest"].update(sha256="xyz"),
    "no subject": lambda s: s.update(subject=[]),
    "a foreign statement type": lambda s: s.update(_type="https://example.com/Statement"),
    "the python name of llama.cpp": lambda s: s["predicate"]["versions"].update(
        llama_cpp=s["predicate"]["versions"].pop("llama.cpp")),
    "type for _type": lambda s: s.update(type=s.pop("_type")),
}


@pytest.mark.parametrize("brk", SCHEMA_BREAKS.values(), ids=SCHEMA_BREAKS.keys())
def test_a_validly_signed_statement_must_still_fit_the_schema(signed, key, brk):
    statement = payload_of(signed)
    brk(statement)
    resigned = sign_payload(json.dumps(statement).encode(), key)
    with pytest.raises(AttestationRefusedError, match="schema"):
        verify_envelope(resigned, [key.public])


def test_the_statement_must_name_the_key_that_signed_it(signed, key):
    other = SigningKey.generate()
    resigned = sign_payload(base64.b64decode(signed["payload"]), other)  # names `key`, signed by `other`
    with pytest.raises(AttestationRefusedError, match="names key"):
        verify_envelope(resigned, [key.public, other.public])


def test_rotation_an_old_key_still_verifies_while_trusted_and_not_after(tmp_path):
    old, new = SigningKey.generate(), SigningKey.generate()
    by_old = sign_statement(build_statement(attested(tmp_path), old.keyid), old)
    assert verify_envelope(by_old, [new.public, old.public]).keyid == old.keyid
    with pytest.raises(AttestationRefusedError, match="not trusted"):
        verify_envelope(by_old, [new.public])


def test_local_files_are_checked_against_their_subjects(tmp_path, key):
    statement = build_statement(attested(tmp_path), key.keyid)
    files = write_files(tmp_path)
    assert check_subjects(statement, files.all) == []
    files.source_files[0].write_text('{"model_type": "llama"}')
    problems = check_subjects(statement, [*files.all, tmp_path / "unrelated.bin"])
    assert len(problems) == 2, problems
    assert "config.json" in problems[0] and "sha256" in problems[0]
    assert "unrelated.bin" in problems[1] and "no subject" in problems[1]


def test_malformed_envelopes_are_refused_not_crashes(key):
    for broken in (None, [], {"payload": "!!", "payloadType": PAYLOAD_TYPE, "signatures": [{"keyid": "a", "sig": "b"}]},
                   {"payload": "", "payloadType": PAYLOAD_TYPE}, "text"):
        with pytest.raises(AttestationRefusedError):
            verify_envelope(broken, [key.public])


def test_the_payload_is_canonical_json(tmp_path, key):
    facts = attested(tmp_path)
    facts.report["not_verified"].append("Größe: non-ASCII stays UTF-8")
    statement = build_statement(facts, key.keyid)
    payload = base64.b64decode(sign_statement(statement, key)["payload"])
    document = json.loads(payload)
    assert payload == json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert "Größe".encode() in payload and payload[:9] == b'{"_type":'


def _reasons(envelope: Any, trusted: list) -> list[str]:
    with pytest.raises(AttestationRefusedError) as refused:
        verify_envelope(envelope, trusted)
    assert str(refused.value) == "; ".join(refused.value.reasons)
    return refused.value.reasons


def test_each_refusal_says_why(signed, key):
    other = SigningKey.generate()
    sig = signed["signatures"][0]
    assert _reasons({**signed, "payload": "!" + signed["payload"]}, [key.public]) == [
        "the payload is not base64: Only base64 data is allowed"]
    bad_sig = {**signed, "signatures": [{**sig, "sig": sig["sig"][:-4] + "$$$$"}]}
    assert _reasons(bad_sig, [key.public])[0].startswith("a signature is not base64")
    twice = {**signed, "signatures": [sig, sig]}
    assert _reasons(twice, [key.public]) == [f"two signatures name key {key.keyid}"]
    two_unknown = {**signed, "signatures": [{**sig, "keyid": "k1"}, {**sig, "keyid": "k2"}]}
    assert _reasons(two_unknown, [key.public, other.public]) == [
        f"signed by key k1, k2, which is not trusted (trusted: {key.keyid}, {other.keyid})"]
    assert _reasons(signed, []) == [f"signed by key {key.keyid}, which is not trusted (trusted: none)"]
    both = {**signed, "signatures": [{**sig, "keyid": key.keyid}, {**sig, "keyid": other.keyid,
                                                                    "sig": base64.b64encode(b"x" * 64).decode()}]}
    assert verify_envelope(both, [key.public, other.public]).keyid == key.keyid  # one good signature suffices
    forged = _flip_payload_byte(signed)
    assert _reasons(forged, [other.public, key.public]) == [
        f"the signature does not verify with trusted key {key.keyid}"]
    both_forged = {**forged, "signatures": [sig, {**sig, "keyid": other.keyid}]}
    assert _reasons(both_forged, [key.public, other.public]) == [
        f"the signature does not verify with trusted key {key.keyid}, {other.keyid}"]
    assert _reasons({**signed, "payloadType": "text/plain"}, [key.public]) == [
        "payloadType is 'text/plain', expected 'application/vnd.in-toto+json'"]
    assert _reasons([], [key.public]) == ["not a DSSE envelope: document: Input should be a valid dictionary or "
                                          "instance of _EnvelopeShape"]


def test_schema_refusals_name_the_fields_at_most_five(signed, key):
    statement = payload_of(signed)
    for field in ("verdict", "gates", "policy", "versions", "not_verified", "signing_keyid"):
        statement["predicate"].pop(field)
    reason, = _reasons(sign_payload(json.dumps(statement).encode(), key), [key.public])
    assert reason.startswith("the statement does not fit the schema: predicate.verdict: Field required; "
                             "predicate.gates: Field required")
    assert reason.count("Field required") == 5
    reason, = _reasons(sign_payload(b"[1]", key), [key.public])
    assert reason.startswith("the statement does not fit the schema: document: Input should be an object")


def test_the_signature_is_plain_dsse_over_the_pae(signed, key):
    """Interoperability: any DSSE verifier checks Ed25519 over PAE(payloadType, payload), per the DSSE spec."""
    payload = base64.b64decode(signed["payload"])
    kind = signed["payloadType"].encode()
    pae = b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(payload), payload)
    key.public.verify(base64.b64decode(signed["signatures"][0]["sig"]), pae)  # raises InvalidSignature otherwise
