"""Two real control planes joined by MultiKueue (issue 36): the manager (etcd, kube-apiserver,
kube-controller-manager, Kueue with a `multiKueue` configuration) where convgate's dispatcher creates
its Jobs, and the worker cluster (the session's `cluster`, with the real `node`) where Kueue runs the
copies MultiKueue makes of them.

What is set up is what docs/kubernetes.md tells an operator to set up, from the files we ship:

- the worker cluster gets manifests/kueue/multikueue/worker.yaml (its ClusterQueue and LocalQueue, and
  the ServiceAccount and ClusterRole the manager's Kueue acts as there) and the chart rendered with
  `topology: worker` (the workers' ServiceAccount, their database Secret and NetworkPolicy);
- the manager gets manifests/kueue/multikueue/manager.yaml (the ClusterQueue with the MultiKueue
  AdmissionCheck, the MultiKueueConfig and MultiKueueCluster) and a kubeconfig Secret holding a token of
  that ServiceAccount with the worker's CA inline, as Kueue requires;
- both get manifests/kueue/'s ResourceFlavor and WorkloadPriorityClasses.

Names are adapted to the test's namespace (the shipped files say `convgate`); the manager's
ClusterQueue, AdmissionCheck and MultiKueue objects are cluster-scoped, so one pair per module.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .cluster import REPO, Cluster
from .convgate_env import chart_objects, wait
from .node import KubeNode

MANIFESTS = REPO / "manifests" / "kueue"
MULTIKUEUE = {"gcInterval": "5s", "workerLostTimeout": "20s"}  # a lost worker is given up on after 20 s
WORKER_CLUSTER = "convgate-cpu-1"  # the MultiKueueCluster (and its kubeconfig Secret) in manager.yaml
CHECK = "convgate-multikueue"
MANAGER_SA = ("kueue-system", "multikueue-manager")  # worker.yaml's ServiceAccount for the manager's Kueue


def shipped(name: str, namespace: str) -> list[dict[str, Any]]:
    """manifests/kueue/multikueue/<name>, every `convgate` namespace and ClusterQueue renamed to `namespace`."""
    docs = [doc for doc in yaml.safe_load_all((MANIFESTS / "multikueue" / name).read_text()) if doc]
    for doc in docs:
        meta, spec = doc["metadata"], doc.get("spec", {})
        if doc["kind"] == "ClusterQueue":
            meta["name"] = namespace
            spec["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] = namespace
        if doc["kind"] == "LocalQueue":
            meta["namespace"], spec["clusterQueue"] = namespace, namespace
    return docs


def condition(obj: dict[str, Any] | None, kind: str) -> str | None:
    for cond in (obj or {}).get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            return str(cond["status"])
    return None


@dataclass
class MultiKueuePair:
    manager: Cluster
    worker: Cluster
    node: KubeNode
    namespace: str

    def setup_worker(self, *, worker_database_url: str, database_port: int) -> None:
        """The worker cluster's side: queues, the manager's ServiceAccount, the chart's `worker` topology with
        the restricted worker login only (the service's own database URL never reaches this cluster)."""
        api, ns = self.worker.api, self.namespace
        for path in ("resource-flavor.yaml", "priority-classes.yaml"):
            api.apply_yaml(MANIFESTS / path)
        for doc in shipped("worker.yaml", ns):
            api.apply(doc)
        values = ("--set", "topology=worker", "--set", f"workerDatabase.url={worker_database_url}",
                  "--set", f"networkPolicy.databasePort={database_port}")
        for doc in chart_objects(ns, values=values):
            api.apply(doc, ns)
        wait(f"worker ClusterQueue {ns} active", lambda: condition(
            api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{ns}"), "Active") == "True", timeout=60)

    def setup_manager(self) -> None:
        """The manager's side (the namespace, LocalQueue and convgate's RBAC come from `Scenario.create`):
        the kubeconfig Secret, then manager.yaml's ClusterQueue with the check and the MultiKueue objects."""
        api = self.manager.api
        api.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": WORKER_CLUSTER,
                                                                       "namespace": "kueue-system"},
                   "stringData": {"kubeconfig": self.worker_kubeconfig()}})
        for doc in shipped("manager.yaml", self.namespace):
            api.apply(doc)
        wait("MultiKueueCluster active (the manager reaches the worker)", self.worker_active, timeout=120)
        wait(f"manager ClusterQueue {self.namespace} active", lambda: condition(
            api.get(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{self.namespace}"), "Active") == "True",
            timeout=60)

    def worker_kubeconfig(self) -> str:
        """A token of worker.yaml's ServiceAccount, the worker's CA inline: what Kueue accepts."""
        namespace, name = MANAGER_SA
        token = self.worker.service_account_token(namespace, name, seconds=24 * 3600)
        ca = base64.b64encode(Path(self.worker.pki.ca.cert_path).read_bytes()).decode()
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "worker",
            "clusters": [{"name": "worker", "cluster": {"server": self.worker.server,
                                                        "certificate-authority-data": ca}}],
            "users": [{"name": "kueue", "user": {"token": token}}],
            "contexts": [{"name": "worker", "context": {"cluster": "worker", "user": "kueue"}}]})

    def secret_mirror_kubeconfig(self, path: Path) -> Path:
        """What the manager's dispatcher gets for the worker cluster (the chart's `multiKueue.workerClusters`):
        a token of the `secret-mirror` ServiceAccount the worker topology rendered, allowed Secrets only."""
        token = self.worker.service_account_token(self.namespace, "convgate-secret-mirror")
        return self.worker.write_kubeconfig(path, token=token, namespace=self.namespace)

    def secret_names(self, cluster: Cluster) -> set[str]:
        items = cluster.api.get(f"/api/v1/namespaces/{self.namespace}/secrets")["items"]
        return {item["metadata"]["name"] for item in items}

    def worker_active(self) -> bool:
        cluster = self.manager.api.get(f"/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/{WORKER_CLUSTER}",
                                       ok404=True)
        return condition(cluster, "Active") == "True"

    def worker_lost(self) -> bool:
        cluster = self.manager.api.get(f"/apis/kueue.x-k8s.io/v1beta2/multikueueclusters/{WORKER_CLUSTER}",
                                       ok404=True)
        return condition(cluster, "Active") == "False"

    # --- the worker cluster going away and coming back -------------------------------------------
    def worker_goes_away(self) -> None:
        """Its API server and Kueue stop (the manager can no longer reach it); etcd keeps its state."""
        self.worker.stop_kueue()
        self.worker.stop_apiserver()

    def worker_comes_back(self) -> None:
        self.worker.restart_apiserver()
        self.worker.start_kueue()

    # --- what the tests look at ------------------------------------------------------------------
    def watch(self, verification_id: str, seen: dict[str, dict[str, Any]]) -> None:
        """Record the verification's Jobs and pods in both clusters as they are now (MultiKueue deletes the
        worker's copies once the manager's Workload finishes, so the test looks while it runs)."""
        for side, cluster in (("manager", self.manager), ("worker", self.worker)):
            try:
                for job in self.jobs(cluster, verification_id):
                    seen[f"{side} job {job['metadata']['name']}"] = job
                for pod in self.pods(cluster, verification_id):
                    seen[f"{side} pod {pod['metadata']['name']}"] = pod
            except Exception:  # the worker cluster may be away: nothing to see there now
                continue


    def jobs(self, cluster: Cluster, verification_id: str) -> list[dict[str, Any]]:
        items = cluster.api.get(f"/apis/batch/v1/namespaces/{self.namespace}/jobs",
                                params={"labelSelector": f"convgate.io/verification-id={verification_id}"})["items"]
        return sorted(items, key=lambda job: job["metadata"]["name"])

    def pods(self, cluster: Cluster, verification_id: str) -> list[dict[str, Any]]:
        return cluster.api.get(f"/api/v1/namespaces/{self.namespace}/pods", params={
            "labelSelector": f"convgate.io/verification-id={verification_id}"})["items"]

    def workload_checks(self, job: dict[str, Any]) -> dict[str, str]:
        """The manager Workload's admission checks (name -> state) for one of its Jobs."""
        workloads = self.manager.api.get(f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{self.namespace}/workloads",
                                         params={"labelSelector": f"kueue.x-k8s.io/job-uid={job['metadata']['uid']}"})
        return {check["name"]: check["state"] for workload in workloads["items"]
                for check in workload.get("status", {}).get("admissionChecks", [])}
