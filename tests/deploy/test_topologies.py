"""The chart's two topologies and the MultiKueue manifests (issue 36, item 3): `topology: worker` renders
only what a MultiKueue worker cluster's namespace needs for the Jobs, and every object validates; the
shipped manager and worker manifests validate against the Kueue module's own CRDs (v1beta2) and name
each other consistently. tests/cluster/test_multikueue.py runs them on two real control planes."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import jsonschema
import pytest
import yaml

from tests.cluster.cluster import find_binaries
from tests.conftest import REPO
from tests.deploy.test_deploy import render, strict, validate

MULTIKUEUE = REPO / "manifests" / "kueue" / "multikueue"
CRDS = {"ClusterQueue": "clusterqueues", "LocalQueue": "localqueues", "AdmissionCheck": "admissionchecks",
        "MultiKueueConfig": "multikueueconfigs", "MultiKueueCluster": "multikueueclusters"}
DB = "postgresql+psycopg://convgate:secret@db:5432/convgate"


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    crds = find_binaries().parent / "kueue-config" / "components" / "crd" / "bases"
    crd = yaml.safe_load((crds / f"kueue.x-k8s.io_{CRDS[kind]}.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1beta2")
    return python_patterns(strict(version["schema"]["openAPIV3Schema"]))


def python_patterns(schema: Any) -> Any:
    """Leave out the few `pattern`s written in Go's regexp syntax that Python's `re` cannot compile (an
    inline flag after the start): every other constraint of the schema still applies."""
    if isinstance(schema, dict):
        kept = {key: python_patterns(value) for key, value in schema.items()}
        if isinstance(kept.get("pattern"), str):
            try:
                re.compile(kept["pattern"])
            except re.error:
                del kept["pattern"]
        return kept
    if isinstance(schema, list):
        return [python_patterns(item) for item in schema]
    return schema


def shipped(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((MULTIKUEUE / name).read_text()) if doc]


def test_the_worker_topology_renders_only_what_the_jobs_need():
    docs = render("--set", "topology=worker", "--set", f"database.url={DB}", "--set", "kueue.createLocalQueue=true")
    assert sorted((doc["kind"], doc["metadata"]["name"]) for doc in docs) == [
        ("LocalQueue", "convgate"), ("NetworkPolicy", "cg-worker"), ("Role", "cg-secret-mirror"),
        ("RoleBinding", "cg-secret-mirror"), ("Secret", "cg-database"), ("ServiceAccount", "cg-secret-mirror"),
        ("ServiceAccount", "cg-worker")]
    (role,) = [doc for doc in docs if doc["kind"] == "Role"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "delete"]}]
    for doc in docs:
        validate(doc)
    restricted = render("--set", "topology=worker", "--set", f"workerDatabase.url={DB}")
    assert ("Secret", "cg-worker-database") in {(doc["kind"], doc["metadata"]["name"]) for doc in restricted}


def test_the_manager_mounts_the_worker_clusters_kubeconfigs_for_the_secret_mirror():
    docs = render("--set", "multiKueue.workerClusters={cpu-1,cpu-2}", "--set", "multiKueue.kubeconfigSecret=wc")
    (config,) = [doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "cg"]
    assert yaml.safe_load(config["data"]["CONVGATE_KUBERNETES__SECRET_MIRRORS"]) == [
        "/etc/convgate/worker-clusters/cpu-1", "/etc/convgate/worker-clusters/cpu-2"]
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["worker-clusters"]["secret"]["secretName"] == "wc"
    from service.config import Settings

    settings = Settings(kubernetes={"secret_mirrors": yaml.safe_load(
        config["data"]["CONVGATE_KUBERNETES__SECRET_MIRRORS"])})  # the service reads what the chart writes
    assert [str(p) for p in settings.kubernetes.secret_mirrors][-1].endswith("cpu-2")


def test_the_worker_topology_leaves_the_control_plane_out_even_when_asked_for_monitoring():
    docs = render("--set", "topology=worker", "--set", "metrics.prometheusRule.enabled=true",
                  "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.dashboard.enabled=true")
    kinds = {doc["kind"] for doc in docs}
    assert not kinds & {"Deployment", "Service", "Job", "ConfigMap", "PrometheusRule", "ServiceMonitor"}
    assert {doc["metadata"]["name"] for doc in docs if doc["kind"] in ("Role", "RoleBinding")} == {"cg-secret-mirror"}


@pytest.mark.parametrize("name", ["manager.yaml", "worker.yaml"])
def test_the_multikueue_manifests_validate(name):
    for doc in shipped(name):
        if doc["apiVersion"].startswith("kueue.x-k8s.io/"):
            assert doc["apiVersion"] == "kueue.x-k8s.io/v1beta2"
            jsonschema.Draft7Validator(crd_schema(doc["kind"])).validate(doc)
        else:
            validate(doc)


def test_the_manager_and_the_worker_name_each_other():
    manager = {doc["kind"]: doc for doc in shipped("manager.yaml")}
    worker = {doc["kind"]: doc for doc in shipped("worker.yaml")}
    check = manager["AdmissionCheck"]
    assert manager["ClusterQueue"]["spec"]["admissionChecksStrategy"] == {
        "admissionChecks": [{"name": check["metadata"]["name"]}]}
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert check["spec"]["parameters"]["name"] == manager["MultiKueueConfig"]["metadata"]["name"]
    assert manager["MultiKueueConfig"]["spec"]["clusters"] == [manager["MultiKueueCluster"]["metadata"]["name"]]
    # the LocalQueue the Jobs name exists, with the same name and namespace, on the worker
    local = yaml.safe_load((REPO / "manifests" / "kueue" / "local-queue.yaml").read_text())
    assert (worker["LocalQueue"]["metadata"]["name"], worker["LocalQueue"]["metadata"]["namespace"]) == (
        local["metadata"]["name"], local["metadata"]["namespace"])
    assert worker["LocalQueue"]["spec"]["clusterQueue"] == worker["ClusterQueue"]["metadata"]["name"]
    from service.dispatch.kube.job_manifest import ALLOWED_RESOURCES

    for queue in (manager["ClusterQueue"], worker["ClusterQueue"]):
        assert set(queue["spec"]["resourceGroups"][0]["coveredResources"]) == ALLOWED_RESOURCES
    binding = worker["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == worker["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == worker["ServiceAccount"]["metadata"]["name"]
