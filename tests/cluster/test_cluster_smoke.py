"""The real control plane works: version, Kueue admission, pods run by the pod runner, the visibility
API, the pod runner's kubelet-like refusals and outcomes, and Kueue's webhook failing closed."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .api import Api, ApiError
from .cluster import REPO, Cluster
from .pod_runner import PodRunner

pytestmark = pytest.mark.cluster

PY = "python3"


def job(name: str, *, queue: str | None, code: str, cpu: str = "100m", env: list[dict[str, Any]] | None = None,
        backoff: int = 0) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "suspend": bool(queue),
            "backoffLimit": backoff,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "main",
                        "image": "python:3.11-slim",
                        "command": [PY, "-c", code],
                        "env": env or [],
                        "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}},
                    }],
                }
            },
        },
    }


def job_condition(api: Api, ns: str, name: str) -> str | None:
    j = api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{name}")
    for c in j.get("status", {}).get("conditions", []):
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return c["type"]
    return None


def namespace(api: Api, name: str) -> str:
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    # Job pods need the namespace's default ServiceAccount (serviceaccount-controller)
    Api.wait(f"ServiceAccount {name}/default",
             lambda: api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default", ok404=True), timeout=30)
    return name


def workload_of(api: Api, ns: str, job_name: str) -> dict[str, Any] | None:
    j = api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/{job_name}")
    for wl in api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads")["items"]:
        if any(o["uid"] == j["metadata"]["uid"] for o in wl["metadata"].get("ownerReferences", [])):
            return wl
    return None


def test_version_is_stamped(cluster: Cluster) -> None:
    versions = json.loads((cluster.bindir.parent / "versions.json").read_text())
    v = cluster.api.get("/version")
    assert v["gitVersion"] == versions["kubernetes"]
    assert v["gitTreeState"] == "clean"
    assert cluster.timings["total"] < 120, cluster.timings
    # every component is up, and Kueue's APIs are served
    assert all(p.alive() for p in cluster.procs.values()), list(cluster.procs)
    groups = {g["name"] for g in cluster.api.get("/apis")["groups"]}
    assert {"kueue.x-k8s.io", "visibility.kueue.x-k8s.io"} <= groups


def test_kueue_admits_job_and_pod_runner_runs_it(cluster: Cluster, pod_runner: PodRunner) -> None:
    from kubernetes import client as k

    api = cluster.api
    ns = namespace(api, "convgate")  # manifests/kueue select the namespace `convgate`
    for f in sorted((REPO / "manifests" / "kueue").glob("*.yaml")):
        api.apply_yaml(f)
    Api.wait("ClusterQueue convgate active", lambda: any(
        c["type"] == "Active" and c["status"] == "True"
        for c in api.get("/apis/kueue.x-k8s.io/v1beta2/clusterqueues/convgate").get("status", {}).get("conditions", [])
    ), timeout=30)

    # created with the ordinary Python client, as the service does
    with cluster.kube_client() as kc:
        created = k.BatchV1Api(kc).create_namespaced_job(ns, job("smoke-b", queue="convgate", code="print(1)"))
        assert created.spec.suspend is True
    Api.wait("Job admitted (unsuspended)", lambda: api.get(
        f"/apis/batch/v1/namespaces/{ns}/jobs/smoke-b")["spec"].get("suspend") is False, timeout=30)
    wl = workload_of(api, ns, "smoke-b")
    assert wl is not None and wl["status"]["admission"]["clusterQueue"] == "convgate"
    assert Api.wait("Job finished", lambda: job_condition(api, ns, "smoke-b"), timeout=60) == "Complete"
    runs = pod_runner.runs_of(ns, "smoke-b-")
    assert [r.exit_code for r in runs] == [0]
    assert pod_runner.log(ns, runs[0].pod).strip() == "1"
    pod = api.get(f"/api/v1/namespaces/{ns}/pods/{runs[0].pod}")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeSelector"] == {"convgate.io/node-pool": "cpu"}  # injected by Kueue from the flavor


def test_second_job_waits_and_shows_in_visibility_api(cluster: Cluster, pod_runner: PodRunner) -> None:
    api = cluster.api
    ns = namespace(api, "smoke-c")
    api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "smoke-c"}})
    api.apply({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "smoke-c"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "smoke-c", "resources": [
                {"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "1Gi"}]}]}],
        },
    })
    api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "lq", "namespace": ns}, "spec": {"clusterQueue": "smoke-c"}})
    sleeper = "import time; time.sleep(120)"
    api.create(job("first", queue="lq", code=sleeper, cpu="1"), ns)
    Api.wait("first Job running", lambda: any(
        r.pod.startswith("first-") and r.exit_code is None for r in pod_runner.runs_of(ns)), timeout=60)
    api.create(job("second", queue="lq", code=sleeper, cpu="1"), ns)
    wl = Api.wait("second Workload", lambda: workload_of(api, ns, "second"), timeout=30)

    def pending() -> list[dict[str, Any]]:
        return api.get(
            f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{ns}/localqueues/lq/pendingworkloads")["items"]

    items = Api.wait("second Job listed as pending", pending, timeout=30)
    assert [i["metadata"]["name"] for i in items] == [wl["metadata"]["name"]]
    assert items[0]["positionInLocalQueue"] == 0
    assert api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/second")["spec"]["suspend"] is True
    assert not pod_runner.runs_of(ns, "second-")

    # removing the first Job frees the quota: the second is admitted and its pod started
    api.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/first", params={"propagationPolicy": "Background"})
    Api.wait("second Job running", lambda: pod_runner.runs_of(ns, "second-"), timeout=60)
    api.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/second", params={"propagationPolicy": "Background"})
    Api.wait("pods gone", lambda: not api.get(f"/api/v1/namespaces/{ns}/pods")["items"], timeout=60)


def test_pod_runner_env_refusal_and_outcomes(cluster: Cluster, pod_runner: PodRunner) -> None:
    api = cluster.api
    ns = namespace(api, f"smoke-runner-{uuid.uuid4().hex[:6]}")
    env = [
        {"name": "PLAIN", "value": "plain"},
        {"name": "EXPANDED", "value": "$(PLAIN)-x"},
        {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    code = "import os; print(' '.join(os.environ[k] for k in ('PLAIN','EXPANDED','FROM_SECRET','FROM_CM','POD')))"
    api.create(job("env", queue=None, code=code, env=env), ns)

    def waiting_reason() -> str | None:
        for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            for cs in p.get("status", {}).get("containerStatuses", []):
                return cs["state"].get("waiting", {}).get("message")
        return None

    assert Api.wait("pod refused", waiting_reason, timeout=30) == 'secret "creds" not found'
    api.create({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"}, "stringData": {"other": "x"}}, ns)
    Api.wait("missing key reported", lambda: waiting_reason() == f"couldn't find key token in Secret {ns}/creds",
             timeout=30)
    api.merge_patch(f"/api/v1/namespaces/{ns}/secrets/creds", {"stringData": {"token": "s3cret"}})
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                "data": {"mode": "fast"}}, ns)
    assert Api.wait("env Job finished", lambda: job_condition(api, ns, "env"), timeout=60) == "Complete"
    (run,) = pod_runner.runs_of(ns, "env-")
    assert pod_runner.log(ns, run.pod).split() == ["plain", "plain-x", "s3cret", "fast", run.pod]
    assert any(r[0] == ns and r[2] == "CreateContainerConfigError" for r in pod_runner.refused)

    # exit 1 -> Failed with the exit code; OOMKilled on request
    api.create(job("crash", queue=None, code="import sys; sys.exit(3)"), ns)
    assert Api.wait("crash Job failed", lambda: job_condition(api, ns, "crash"), timeout=60) == "Failed"
    pod_runner.oom_when = lambda pod, c: pod["metadata"]["name"].startswith("oom-")
    try:
        api.create(job("oom", queue=None, code="import time; time.sleep(60)"), ns)
        assert Api.wait("oom Job failed", lambda: job_condition(api, ns, "oom"), timeout=60) == "Failed"
    finally:
        pod_runner.oom_when = None
    terminated = {}
    for p in api.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
        assert p["status"]["phase"] == "Failed" or p["metadata"]["name"].startswith("env-")
        terminated[p["metadata"]["name"].split("-")[0]] = p["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["crash"]["exitCode"], terminated["crash"]["reason"]) == (3, "Error")
    assert (terminated["oom"]["exitCode"], terminated["oom"]["reason"]) == (137, "OOMKilled")
    assert pod_runner.errors == []


def test_job_creation_refused_while_kueue_is_down(cluster: Cluster, pod_runner: PodRunner, tmp_path: Path) -> None:
    api = cluster.api
    ns = namespace(api, "smoke-d")
    cluster.stop_kueue()
    try:
        t0 = time.monotonic()
        with pytest.raises(ApiError) as err:
            api.create(job("refused", queue="lq", code="print(1)"), ns)
        assert err.value.status == 500
        assert "failed calling webhook" in str(err.value) and "kueue" in str(err.value)
        assert time.monotonic() - t0 < 30
        assert api.get(f"/apis/batch/v1/namespaces/{ns}/jobs/refused", ok404=True) is None
    finally:
        t1 = time.monotonic()
        cluster.start_kueue()
        restart = time.monotonic() - t1
    # back up: the same Job is accepted again
    api.create(job("accepted", queue="lq", code="print(1)"), ns)
    assert restart < 60
