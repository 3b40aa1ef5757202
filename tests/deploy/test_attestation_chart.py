"""Issue 13 item 1 in the chart: the operator's signing key comes from a Secret mounted read-only into
the API pods (only group-readable, by the pod's fsGroup) and named in the settings; rotated-out public
keys are mounted from a ConfigMap and listed as trusted; the model-signing key is another key of the same
Secret and publishers' keys another ConfigMap; without a Secret nothing is mounted."""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from engine.oms import load_public_key
from service.config import Settings
from tests.deploy.test_deploy import VALUE_SETS, render


def _by_kind(docs, kind, name_suffix=""):
    return [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]


def test_the_signing_key_secret_and_trusted_keys_reach_the_api_pods_and_the_settings(monkeypatch):
    docs = render(*VALUE_SETS["production"])
    deployment = _by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    config = next(d for d in _by_kind(docs, "ConfigMap") if "CONVGATE_DISPATCHER" in d["data"])["data"]
    trusted = _by_kind(docs, "ConfigMap", "-trusted-keys")[0]
    volumes = {v["name"]: v for v in deployment["volumes"]}
    mounts = {m["name"]: m for m in deployment["containers"][0]["volumeMounts"]}
    secret = volumes["signing-key"]["secret"]
    assert secret["secretName"] == "convgate-attestation-key" and secret["defaultMode"] == 0o440
    key_file = PurePosixPath(config["CONVGATE_SIGNING_KEY_FILE"])
    assert mounts["signing-key"]["readOnly"] is True
    assert key_file.parent == PurePosixPath(mounts["signing-key"]["mountPath"])
    model_key_file = PurePosixPath(config["CONVGATE_MODEL_SIGNING_KEY_FILE"])  # issue 25: the same Secret
    assert model_key_file.parent == key_file.parent
    assert [item["path"] for item in secret["items"]] == [key_file.name, model_key_file.name]
    trusted_files = [PurePosixPath(p) for p in json.loads(config["CONVGATE_TRUSTED_KEY_FILES"])]
    assert {p.parent for p in trusted_files} == {PurePosixPath(mounts["trusted-keys"]["mountPath"])}
    assert sorted(p.name for p in trusted_files) == sorted(trusted["data"])
    assert volumes["trusted-keys"]["configMap"]["name"] == trusted["metadata"]["name"]
    assert all(pem.startswith("-----BEGIN PUBLIC KEY-----") for pem in trusted["data"].values())
    publishers = _by_kind(docs, "ConfigMap", "-publisher-keys")[0]
    publisher_files = [PurePosixPath(p) for p in json.loads(config["CONVGATE_PUBLISHER_KEY_FILES"])]
    assert {p.parent for p in publisher_files} == {PurePosixPath(mounts["publisher-keys"]["mountPath"])}
    assert sorted(p.name for p in publisher_files) == sorted(publishers["data"])
    assert volumes["publisher-keys"]["configMap"]["name"] == publishers["metadata"]["name"]
    for pem in publishers["data"].values():
        load_public_key(pem)  # an OMS key the service accepts
    for key, value in config.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CONVGATE_DATABASE_URL", "postgresql+psycopg://u@db/convgate")
    settings = Settings()
    assert str(settings.signing_key_file) == str(key_file)
    assert [str(p) for p in settings.trusted_key_files] == [str(p) for p in trusted_files]
    assert str(settings.model_signing_key_file) == str(model_key_file)
    assert [str(p) for p in settings.publisher_key_files] == [str(p) for p in publisher_files]


def test_without_a_secret_no_key_is_mounted_or_configured():
    docs = render(*VALUE_SETS["default"])
    deployment = _by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    config = next(d for d in _by_kind(docs, "ConfigMap") if "CONVGATE_DISPATCHER" in d["data"])["data"]
    assert not {"signing-key", "trusted-keys", "publisher-keys"} & {v["name"] for v in deployment["volumes"]}
    assert not {"CONVGATE_SIGNING_KEY_FILE", "CONVGATE_TRUSTED_KEY_FILES", "CONVGATE_MODEL_SIGNING_KEY_FILE",
                "CONVGATE_PUBLISHER_KEY_FILES"} & set(config)
    assert not _by_kind(docs, "ConfigMap", "-trusted-keys") and not _by_kind(docs, "ConfigMap", "-publisher-keys")
