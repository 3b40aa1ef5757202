"""Issue 13 item 1, offline side: `convgate keys show` and `convgate attestation verify` (exit 0 verified,
1 refused with one line per reason, 2 cannot check), and the signing key's life: configured, or
generated once (mode 0600) and reused."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from typer.testing import CliRunner

from service.attestations import (
    KeyFileError,
    SigningKey,
    active_signing_key,
    build_statement,
    generated_key,
    load_public_key,
    load_signing_key,
    public_pem,
    sign_statement,
    trusted_public_keys,
)
from service.attestations.keys import GENERATED_KEY
from service.cli import app
from service.config import Settings
from tests.unit.attestation_reports import write_files
from tests.unit.test_attestation_envelope import attested


def write_key(path: Path, key: SigningKey) -> Path:
    path.write_bytes(key.private_pem())
    return path


def write_public(path: Path, key: SigningKey) -> Path:
    path.write_text(public_pem(key.public))
    return path


@pytest.fixture
def case(tmp_path: Path) -> dict[str, Path]:
    key = SigningKey.generate()
    envelope = sign_statement(build_statement(attested(tmp_path), key.keyid), key)
    (tmp_path / "att.json").write_text(json.dumps(envelope))
    return {"envelope": tmp_path / "att.json", "public": write_public(tmp_path / "pub.pem", key), "root": tmp_path}


def verify(*args: str | Path):
    return CliRunner().invoke(app, ["attestation", "verify", *map(str, args)])


def test_verify_accepts_a_good_envelope_with_its_files(case):
    files = write_files(case["root"])
    subjects = [arg for path in files.all for arg in ("--subject", path)]
    result = verify(case["envelope"], "--key", case["public"], *subjects)
    assert result.exit_code == 0, result.output
    assert "verified: GO" in result.output and "4 local file(s)" in result.output


def test_verify_json_names_the_key_and_the_statement(case):
    result = verify(case["envelope"], "--key", case["public"], "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["verified"] is True and document["problems"] == []
    assert document["keyid"] == document["statement"]["predicate"]["signing_keyid"]


def test_verify_refuses_a_changed_file_and_says_which(case):
    files = write_files(case["root"])
    files.imatrix.write_bytes(b"another matrix")
    result = verify(case["envelope"], "--key", case["public"], "--subject", files.imatrix, "--json")
    assert result.exit_code == 1
    assert "imatrix.gguf: sha256" in result.stderr
    assert json.loads(result.stdout)["verified"] is False


def test_verify_refuses_a_tampered_envelope_and_an_untrusted_key(case):
    envelope = json.loads(case["envelope"].read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["verdict"] = "NO-GO"
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    forged = case["root"] / "forged.json"
    forged.write_text(json.dumps(envelope))
    result = verify(forged, "--key", case["public"])
    assert result.exit_code == 1 and "signature does not verify" in result.stderr
    stranger = write_public(case["root"] / "stranger.pem", SigningKey.generate())
    result = verify(case["envelope"], "--key", stranger)
    assert result.exit_code == 1 and "not trusted" in result.stderr
    result = verify(case["envelope"], "--key", stranger, "--key", case["public"])  # rotation: either may sign
    assert result.exit_code == 0, result.output


def test_verify_cannot_check_without_a_usable_key_or_file(case):
    assert verify(case["envelope"], "--key", case["root"] / "missing.pem").exit_code == 2
    assert verify(case["root"] / "missing.json", "--key", case["public"]).exit_code == 2
    (case["root"] / "junk.json").write_text("{not json")
    assert verify(case["root"] / "junk.json", "--key", case["public"]).exit_code == 1


def test_the_generated_key_is_private_and_made_once(tmp_path):
    path = tmp_path / "keys" / "k.pem"
    first = generated_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert generated_key(path).keyid == first.keyid
    assert [p.name for p in path.parent.iterdir()] == ["k.pem"]  # no temporary left behind
    beside = path.parent / "second.pem"  # the folder exists already
    assert generated_key(beside).keyid != first.keyid
    assert stat.S_IMODE(beside.stat().st_mode) == 0o600


def test_a_key_generated_by_a_racing_process_is_the_one_used(tmp_path, monkeypatch):
    path = tmp_path / "k.pem"
    winner = SigningKey.generate()
    real_link = os.link

    def racing_link(source, target):
        assert Path(source).parent == Path(target).parent  # a link cannot cross filesystems
        write_key(Path(target), winner)  # another process linked its key first
        real_link(source, target)

    monkeypatch.setattr(os, "link", racing_link)
    assert generated_key(path).keyid == winner.keyid
    assert [p.name for p in tmp_path.iterdir()] == ["k.pem"]


def test_settings_choose_the_configured_key_else_the_generated_one(tmp_path):
    configured = write_key(tmp_path / "signing.pem", SigningKey.generate())
    old = write_public(tmp_path / "old.pem", SigningKey.generate())
    settings = Settings(cache_dir=tmp_path / "cache", signing_key_file=configured, trusted_key_files=(old,))
    assert active_signing_key(settings).keyid == load_signing_key(configured).keyid
    assert not (tmp_path / "cache" / GENERATED_KEY).exists()
    assert [public_pem(k) for k in trusted_public_keys(settings)] == [
        public_pem(load_signing_key(configured).public), old.read_text()]
    embedded = Settings(cache_dir=tmp_path / "cache")
    assert active_signing_key(embedded).keyid == active_signing_key(embedded).keyid
    assert (tmp_path / "cache" / GENERATED_KEY).exists()


def test_keys_that_are_not_ed25519_are_refused(tmp_path):
    ec = generate_private_key(SECP256R1())
    pem = ec.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                           serialization.NoEncryption())
    (tmp_path / "ec.pem").write_bytes(pem)
    for load, kind in ((load_signing_key, type(ec).__name__), (load_public_key, type(ec.public_key()).__name__)):
        with pytest.raises(KeyFileError) as refused:
            load(tmp_path / "ec.pem")
        assert str(refused.value) == f"{tmp_path / 'ec.pem'} holds a {kind}; attestations are signed with Ed25519"
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(KeyFileError, match=r"junk.pem is not an unencrypted PEM private key: "):
        load_signing_key(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match=r"junk.pem is not a PEM public key: "):
        load_public_key(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match=r"cannot read key file .*missing.pem: No such file"):
        load_public_key(tmp_path / "missing.pem")


def test_keys_show_prints_the_active_public_key_and_its_id(tmp_path, monkeypatch):
    key = SigningKey.generate()
    old = SigningKey.generate()
    monkeypatch.setenv("CONVGATE_SIGNING_KEY_FILE", str(write_key(tmp_path / "signing.pem", key)))
    monkeypatch.setenv("CONVGATE_TRUSTED_KEY_FILES", json.dumps([str(write_public(tmp_path / "old.pem", old))]))
    result = CliRunner().invoke(app, ["keys", "show"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"keyid: {key.keyid}\n{public_pem(key.public)}")
    assert f"also trusted: {old.keyid}" in result.stdout
    shown = json.loads(CliRunner().invoke(app, ["keys", "show", "--json"]).stdout)
    assert shown["keyid"] == key.keyid and shown["public_key_pem"] == public_pem(key.public)
    assert [t["keyid"] for t in shown["trusted"]] == [old.keyid]
    (tmp_path / "pub-from-show.pem").write_text(shown["public_key_pem"])
    assert load_public_key(tmp_path / "pub-from-show.pem") == key.public
