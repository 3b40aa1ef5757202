"""Kueue's installation objects, read from the Kueue module's own `config/` (copied next to the
binaries by scripts/build_kube.py) and adapted to a Kueue that runs as a local process.

What `kustomize build config/default` would do is redone here for the objects we keep (there is no
kustomize binary): the `kueue-` name prefix, namespace `kueue-system`, the CRD conversion patches
listed in `config/components/crd/kustomization.yaml`, and the webhooks' namespaceSelector from
`config/components/webhook/kustomization.yaml`. Kept: Namespace, CRDs, the (empty) webhook Secret,
both webhook configurations, the webhook and visibility Services, the visibility APIServices.
Dropped: the Deployment and its RBAC (the local process runs with the admin kubeconfig).

The Services become `type: ExternalName` pointing at 127.0.0.1, and every service reference gets
the local port, so the API server dials the local process while checking its TLS name
`kueue-webhook-service.kueue-system.svc` against the certificate Kueue issues itself.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

NAMESPACE = "kueue-system"
PREFIX = "kueue-"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
VISIBILITY_SERVICE = "kueue-visibility-server"
LOCAL_HOST = "127.0.0.1"


def _load_all(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _crds(config: Path, webhook_port: int) -> list[dict[str, Any]]:
    crd_dir = config / "components" / "crd"
    kust = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    crds = {}
    for res in kust["resources"]:
        for doc in _load_all(crd_dir / res):
            crds[doc["metadata"]["name"]] = doc
    for patch in kust.get("patches", []):
        p = yaml.safe_load((crd_dir / patch["path"]).read_text())
        conversion = copy.deepcopy(p["spec"]["conversion"])
        svc = conversion["webhook"]["clientConfig"]["service"]
        svc.update(name=WEBHOOK_SERVICE, namespace=NAMESPACE, port=webhook_port)
        crds[p["metadata"]["name"]]["spec"]["conversion"] = conversion
    return list(crds.values())


def _webhooks(config: Path, webhook_port: int) -> list[dict[str, Any]]:
    wh_dir = config / "components" / "webhook"
    kust = yaml.safe_load((wh_dir / "kustomization.yaml").read_text())
    # The namespaceSelector patched onto vpod.kb.io and copied (replacements) to the listed webhooks.
    selector = None
    for patch in kust.get("patches", []):
        body = yaml.safe_load(patch["patch"])
        for wh in body.get("webhooks", []):
            if "namespaceSelector" in wh:
                selector = wh["namespaceSelector"]
    targets: set[str] = set()
    for repl in kust.get("replacements", []):
        for tgt in repl.get("targets", []):
            for fp in tgt.get("fieldPaths", []):
                m = re.search(r"\[name=([^\]]+)\]", fp)
                if m:
                    targets.add(m.group(1))
    docs = []
    for doc in _load_all(wh_dir / "manifests.yaml"):
        doc["metadata"]["name"] = PREFIX + doc["metadata"]["name"]
        for wh in doc["webhooks"]:
            wh["clientConfig"]["service"].update(name=WEBHOOK_SERVICE, namespace=NAMESPACE, port=webhook_port)
            if selector is not None and (wh["name"] in targets or wh["name"] == "vpod.kb.io"):
                wh["namespaceSelector"] = copy.deepcopy(selector)
        docs.append(doc)
    return docs


def _apiservices(config: Path, visibility_port: int) -> list[dict[str, Any]]:
    vis = config / "components" / "visibility"
    kust = yaml.safe_load((vis / "kustomization.yaml").read_text())
    out = []
    for res in kust["resources"]:
        for doc in _load_all(vis / res):
            if doc["kind"] == "APIService":
                doc["spec"]["service"].update(name=VISIBILITY_SERVICE, namespace=NAMESPACE, port=visibility_port)
                out.append(doc)
    return out


def _external_service(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": "kueue"}},
        "spec": {
            "type": "ExternalName",
            "externalName": LOCAL_HOST,
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": port}],
        },
    }


def render(config: Path, *, webhook_port: int, visibility_port: int) -> list[dict[str, Any]]:
    """Objects in apply order."""
    secret = _load_all(config / "components" / "internalcert" / "secret.yaml")[0]
    secret["metadata"].update(name=WEBHOOK_SECRET, namespace=NAMESPACE)
    assert secret["metadata"]["name"] == PREFIX + "webhook-server-cert"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        *_crds(config, webhook_port),
        secret,
        _external_service(WEBHOOK_SERVICE, webhook_port),
        _external_service(VISIBILITY_SERVICE, visibility_port),
        *_webhooks(config, webhook_port),
        *_apiservices(config, visibility_port),
    ]


def configuration(
    *, webhook_port: int, visibility_port: int, health_port: int, cert_dir: Path, frameworks: list[str],
    multikueue: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A config.kueue.x-k8s.io/v1beta2 Configuration for the local process; `multikueue` (the
    Configuration's `multiKueue` stanza) for a MultiKueue manager."""
    extra = {"multiKueue": multikueue} if multikueue is not None else {}
    return extra | {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"{LOCAL_HOST}:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": LOCAL_HOST, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "visibilityServer": {"bindAddress": LOCAL_HOST, "bindPort": visibility_port},
        "clientConnection": {"qps": 300, "burst": 500},
        "integrations": {"frameworks": frameworks},
    }
