"""The real node works: pods from an offline image run under kubelet + containerd + runc, a Job admitted
by the real Kueue runs there, the kernel OOM-kills a container over its memory limit and the kubelet
reports it, the service-account token is mounted only when asked for, a pod reaches the API server
through the `kubernetes` Service (kube-proxy), a pod's port is reached through a Service and through
`kubectl port-forward`, and kube-router enforces NetworkPolicy.

Every test here runs on tests/cluster/node.py's node, none on the pod runner.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import httpx
import pytest

from .api import Api
from .cluster import REPO, Cluster
from .node import KubeNode

pytestmark = pytest.mark.cluster

RESTRICTED = {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def pod(name: str, image: str, script: str, *, memory: str = "32Mi", automount: bool | None = None,
        ports: tuple[int, ...] = (), labels: dict[str, str] | None = None, restart: str = "Never",
        env: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "containers": [{
            "name": "main", "image": image, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script], "securityContext": RESTRICTED,
            "resources": {"requests": {"cpu": "10m", "memory": memory}, "limits": {"cpu": "500m", "memory": memory}},
            "ports": [{"containerPort": p} for p in ports],
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        }],
    }
    if automount is not None:
        spec["automountServiceAccountToken"] = automount
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def wait_phase(api: Api, ns: str, name: str, *phases: str, timeout: float = 90) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        p = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        return p if p.get("status", {}).get("phase") in phases else None

    try:
        return Api.wait(f"pod {ns}/{name} in {phases}", done, timeout=timeout)
    except TimeoutError:
        p = api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        raise AssertionError(f"pod {ns}/{name}: {json.dumps(p.get('status'), indent=1)[:3000]}") from None


def pod_log(api: Api, ns: str, name: str) -> str:
    return api.get(f"/api/v1/namespaces/{ns}/pods/{name}/log")


@pytest.fixture
def ns(node: KubeNode) -> Any:
    made: list[str] = []

    def make(prefix: str, **kw: Any) -> str:
        made.append(node.namespace(f"{prefix}-{uuid.uuid4().hex[:5]}", **kw))
        return made[-1]

    yield make
    for name in made:
        node.api.delete(f"/api/v1/namespaces/{name}", ok404=True)


def test_node_is_the_real_thing(cluster: Cluster, node: KubeNode) -> None:
    versions = json.loads((cluster.bindir.parent / "versions.json").read_text())
    n = cluster.api.get(f"/api/v1/nodes/{node.name}")
    info = n["status"]["nodeInfo"]
    assert info["kubeletVersion"] == versions["kubernetes"]
    assert info["containerRuntimeVersion"].startswith("containerd://2."), info
    assert n["metadata"]["labels"]["convgate.io/node-pool"] == "cpu"
    assert {"type": "InternalIP", "address": node.ip} in n["status"]["addresses"]
    assert float(n["status"]["allocatable"]["cpu"]) >= 1
    print(f"node start-up: {node.timings}")


def test_busybox_pod_runs_to_succeeded(node: KubeNode, ns: Any) -> None:
    t0 = time.monotonic()
    name = ns("smoke-pod")
    node.api.create(pod("hello", node.busybox, "echo hello from $(hostname); id -u; cat /proc/self/cgroup"), name)
    done = wait_phase(node.api, name, "hello", "Succeeded", "Failed")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == node.name
    (status,) = done["status"]["containerStatuses"]
    assert status["containerID"].startswith("containerd://")
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["imageID"].startswith(node.busybox.rsplit(":", 1)[0]) or status["imageID"].startswith("sha256:")
    log = pod_log(node.api, name, "hello")  # API server -> kubelet (its serving cert, our client cert)
    lines = log.splitlines()
    assert lines[0] == "hello from hello" and lines[1] == "65534", log
    assert any("/kubepods" in line for line in lines[2:]), log  # the kubelet's pod cgroup, via runc
    assert re.match(r"^10\.244\.0\.\d+$", done["status"]["podIP"]), done["status"]
    print(f"busybox pod: {time.monotonic() - t0:.1f}s")


def test_kueue_admits_a_job_that_runs_on_the_node(node: KubeNode, ns: Any) -> None:
    t0 = time.monotonic()
    api = node.api
    name = ns("smoke-kueue")
    api.apply_yaml(REPO / "manifests" / "kueue" / "resource-flavor.yaml")
    api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": name}},
        "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{"name": "convgate-cpu", "resources": [
            {"name": "cpu", "nominalQuota": "1"}, {"name": "memory", "nominalQuota": "1Gi"}]}]}]}})
    api.apply({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "lq", "namespace": name}, "spec": {"clusterQueue": name}})
    try:
        template = pod("x", node.busybox, "echo done")
        api.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "queued", "labels": {"kueue.x-k8s.io/queue-name": "lq"}},
            "spec": {"suspend": True, "backoffLimit": 0, "template": {"spec": template["spec"]}}}, name)

        def finished() -> str | None:
            j = api.get(f"/apis/batch/v1/namespaces/{name}/jobs/queued")
            return next((c["type"] for c in j.get("status", {}).get("conditions", [])
                         if c["type"] in ("Complete", "Failed") and c["status"] == "True"), None)

        assert Api.wait("Job finished", finished, timeout=120) == "Complete"
        (p,) = api.get(f"/api/v1/namespaces/{name}/pods",
                       params={"labelSelector": "batch.kubernetes.io/job-name=queued"})["items"]
        assert p["spec"]["nodeName"] == node.name
        assert p["spec"]["nodeSelector"] == {"convgate.io/node-pool": "cpu"}  # from the flavor, via Kueue
        assert pod_log(api, name, p["metadata"]["name"]).strip() == "done"
        (wl,) = api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{name}/workloads")["items"]
        assert wl["status"]["admission"]["clusterQueue"] == name
    finally:
        api.delete(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{name}", ok404=True)
    print(f"Kueue Job on the node: {time.monotonic() - t0:.1f}s")


def test_memory_hog_is_oom_killed_by_the_kernel(node: KubeNode, ns: Any) -> None:
    t0 = time.monotonic()
    name = ns("smoke-oom")
    # dd (the container's main process) fills a 256 MiB buffer from /dev/zero: far past the 32 MiB limit
    node.api.create(pod("hog", node.busybox, "exec dd if=/dev/zero of=/dev/null bs=256M count=1"), name)
    done = wait_phase(node.api, name, "hog", "Succeeded", "Failed")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (done["status"]["phase"], term["reason"], term["exitCode"]) == ("Failed", "OOMKilled", 137), term
    print(f"OOM kill: {time.monotonic() - t0:.1f}s")


def test_service_account_token_is_mounted_only_when_asked(node: KubeNode, ns: Any) -> None:
    name = ns("smoke-token")
    check = f"if [ -s {TOKEN_DIR}/token ]; then echo mounted; else echo absent; fi; ls {TOKEN_DIR} 2>&1 | sort"
    node.api.create(pod("with", node.busybox, check, automount=True), name)
    node.api.create(pod("without", node.busybox, check, automount=False), name)
    for p in ("with", "without"):
        assert wait_phase(node.api, name, p, "Succeeded", "Failed")["status"]["phase"] == "Succeeded"
    with_log, without_log = pod_log(node.api, name, "with"), pod_log(node.api, name, "without")
    assert with_log.splitlines()[0] == "mounted" and {"ca.crt", "namespace", "token"} <= set(with_log.split()), with_log
    assert without_log.splitlines()[0] == "absent", without_log


def test_pod_reaches_the_api_server_through_the_kubernetes_service(cluster: Cluster, node: KubeNode, ns: Any) -> None:
    t0 = time.monotonic()
    name = ns("smoke-svc")
    svc = cluster.api.get("/api/v1/namespaces/default/services/kubernetes")
    assert svc["spec"]["clusterIP"] == "10.0.0.1"
    # kubectl's in-cluster configuration: the Service's environment variables, the mounted token and
    # CA (the API server's certificate is checked against it, for the Service's address)
    script = 'echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; exec kubectl get --raw /version'
    node.api.create(pod("caller", node.kubectl_image, script, automount=True, memory="128Mi",
                        env={"HOME": "/tmp"}), name)
    done = wait_phase(node.api, name, "caller", "Succeeded", "Failed")
    log = pod_log(node.api, name, "caller")
    assert done["status"]["phase"] == "Succeeded", log
    first, body = log.split("\n", 1)
    assert first == "10.0.0.1:443"
    assert json.loads(body)["gitVersion"] == cluster.api.get("/version")["gitVersion"]
    # the API server saw the pod's own address (kube-proxy DNATs, nothing masquerades)
    events = cluster.audit_events(lambda user: user == f"system:serviceaccount:{name}:default")
    assert any(done["status"]["podIP"] in e.get("sourceIPs", []) and e["requestURI"] == "/version" for e in events)
    print(f"pod -> kubernetes Service -> API server: {time.monotonic() - t0:.1f}s")


def test_a_pods_port_through_a_service_and_port_forward(node: KubeNode, ns: Any) -> None:
    t0 = time.monotonic()
    api = node.api
    name = ns("smoke-port")
    serve = "mkdir -p /tmp/www && echo served-by-$(hostname) > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
    api.create(pod("web", node.busybox, serve, ports=[8080], labels={"app": "web"}), name)
    api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}, name)
    wait_phase(api, name, "web", "Running")
    cluster_ip = api.get(f"/api/v1/namespaces/{name}/services/web")["spec"]["clusterIP"]
    # another pod, through the Service's cluster IP (kube-proxy's rules, the bridge)
    api.create(pod("client", node.busybox, f"for i in 1 2 3 4 5 6 7 8 9 10; do wget -q -O - http://{cluster_ip}/ && "
                                           "exit 0; sleep 1; done; exit 1"), name)
    done = wait_phase(api, name, "client", "Succeeded", "Failed")
    assert pod_log(api, name, "client").strip() == "served-by-web", done["status"]
    # kubectl port-forward: API server -> kubelet -> containerd's stream server -> the pod's netns
    with node.kubectl_popen("-n", name, "port-forward", "pod/web", ":8080") as pf:
        try:
            assert pf.stdout is not None
            line = pf.stdout.readline()
            m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
            assert m, line
            r = httpx.get(f"http://127.0.0.1:{m.group(1)}/", timeout=10, trust_env=False)
            assert r.text.strip() == "served-by-web"
        finally:
            pf.terminate()
            pf.communicate(timeout=10)
    print(f"Service + port-forward: {time.monotonic() - t0:.1f}s")


def test_network_policy_is_enforced_by_kube_router(node: KubeNode, ns: Any) -> None:
    """kube-router's network policy controller (built from its Go module, v2.1.0) enforces NetworkPolicy
    on the node with iptables and ipset: once `web` admits only pods labelled role=allowed, another pod
    is refused and an allowed one gets through."""
    t0 = time.monotonic()
    api = node.api
    name = ns("smoke-netpol")
    serve = "mkdir -p /tmp/www && echo served > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www"
    api.create(pod("web", node.busybox, serve, ports=(8080,), labels={"app": "web"}), name)
    web_ip = wait_phase(api, name, "web", "Running")["status"]["podIP"]
    fetch = f"wget -q -O - http://{web_ip}:8080/"
    api.create(pod("before", node.busybox, f"for i in $(seq 10); do {fetch} && exit 0; sleep 1; done; exit 1"), name)
    assert wait_phase(api, name, "before", "Succeeded", "Failed")["status"]["phase"] == "Succeeded"
    api.create({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "web"},
                "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                         "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "allowed"}}}],
                                      "ports": [{"port": 8080}]}]}}, name)
    # kube-router applies a policy on its watch event: a probe outside the policy retries until refused
    api.create(pod("probe", node.busybox, f"for i in $(seq 30); do {fetch} || exit 0; sleep 1; done; exit 1"), name)
    assert wait_phase(api, name, "probe", "Succeeded", "Failed")["status"]["phase"] == "Succeeded"
    # denied: three tries over a few seconds, every one refused (kube-router REJECTs)
    api.create(pod("denied", node.busybox, f"for i in 1 2 3; do {fetch} && echo through; sleep 2; done; true"), name)
    # allowed: its address joins the policy's ipset once kube-router sees the pod: retry until then
    api.create(pod("allowed", node.busybox, f"for i in $(seq 20); do {fetch} && exit 0; sleep 1; done; exit 1",
                   labels={"role": "allowed"}), name)
    for p in ("denied", "allowed"):
        assert wait_phase(api, name, p, "Succeeded", "Failed")["status"]["phase"] == "Succeeded", pod_log(api, name, p)
    denied = pod_log(api, name, "denied")
    assert "through" not in denied and denied.count("Connection refused") == 3, denied
    assert "served" in pod_log(api, name, "allowed")
    print(f"NetworkPolicy (kube-router): {time.monotonic() - t0:.1f}s")
