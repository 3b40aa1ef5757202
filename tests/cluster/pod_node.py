"""The pod runner's node and scheduler half: one registered Node (`Ready`, with the labels it is
given) and the binding of every unbound pod that fits it (nodeSelector / required node affinity, no
scheduling gates, default scheduler) through the `pods/binding` subresource, as kube-scheduler would;
plus the pod-status writes both halves use.

When the real node (node.py) runs in the same session, the two share the cluster: this Node is
tainted `convgate.io/test-node=pod-runner:NoSchedule`, so the real kube-scheduler never places a pod
here, and pods that tolerate the real node's taint (those of `KubeNode.namespace()` namespaces) are
left to kube-scheduler."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .api import Api, ApiError
from .pod_env import PodDict, now

TAINT_KEY = "convgate.io/test-node"  # node.py's taint key; the real node's value is "kubelet"
TAINT = {"key": TAINT_KEY, "value": "pod-runner", "effect": "NoSchedule"}


def for_real_node(pod: PodDict) -> bool:
    """The pod tolerates the real node's taint: kube-scheduler and the kubelet take it."""
    return any(t.get("key") == TAINT_KEY and t.get("value") == "kubelet"
               for t in pod["spec"].get("tolerations") or [])


def merge_condition(status: dict[str, Any], typ: str, value: str, reason: str | None = None,
                    message: str | None = None) -> None:
    conds = status.setdefault("conditions", [])
    for c in conds:
        if c["type"] == typ:
            if c.get("status") != value:
                c["lastTransitionTime"] = now()
            c["status"] = value
            c.pop("reason", None)
            c.pop("message", None)
            break
    else:
        c = {"type": typ, "status": value, "lastTransitionTime": now(), "lastProbeTime": None}
        conds.append(c)
    if reason:
        c["reason"] = reason
    if message:
        c["message"] = message


def set_status(api: Api, ns: str, name: str, mutate: Callable[[dict[str, Any]], None]) -> bool:
    """Read-modify-write of a pod's status, retried on conflicts; False when the pod is gone."""
    path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
    for _ in range(20):
        pod = api.get(f"/api/v1/namespaces/{ns}/pods/{name}", ok404=True)
        if pod is None:
            return False
        status = pod.setdefault("status", {})
        mutate(status)
        try:
            api.put(path, pod)
            return True
        except ApiError as exc:
            if exc.status == 409:
                continue
            if exc.status == 404:
                return False
            raise
    return False


class Node:
    """The Node object and the scheduler's binding decisions for it."""

    def __init__(self, api: Api, name: str, labels: dict[str, str], capacity: dict[str, str],
                 errors: list[str]) -> None:
        self.api = api
        self.node_name = name
        self.node_labels = labels
        self.capacity = capacity
        self.errors = errors
        self._unschedulable_noted: set[str] = set()

    def register(self) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": self.node_labels},
            "spec": {"taints": [TAINT]},
        }
        existing = self.api.get(f"/api/v1/nodes/{self.node_name}", ok404=True)
        if existing is None:
            existing = self.api.post("/api/v1/nodes", node)
        else:
            existing = self.api.merge_patch(f"/api/v1/nodes/{self.node_name}",
                                            {"metadata": {"labels": self.node_labels}, "spec": {"taints": [TAINT]}})
        at = now()
        existing["status"] = {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": self.node_name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "pod runner is ready", "lastHeartbeatTime": at, "lastTransitionTime": at}],
            "nodeInfo": {"kubeletVersion": "pod-runner", "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "local-process://1", "kernelVersion": os.uname().release,
                         "osImage": "local", "kubeProxyVersion": "", "machineID": "", "systemUUID": "", "bootID": ""},
        }
        self.api.put(f"/api/v1/nodes/{self.node_name}/status", existing)


    def fits(self, pod: PodDict) -> str | None:
        spec = pod["spec"]
        for k, v in (spec.get("nodeSelector") or {}).items():
            if self.node_labels.get(k) != v:
                return f"node(s) didn't match Pod's node selector ({k}={v})"
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        if required:
            terms = required.get("nodeSelectorTerms", [])
            if terms and not any(self._term_matches(t) for t in terms):
                return "node(s) didn't match Pod's node affinity/selector"
        return None

    def _term_matches(self, term: dict[str, Any]) -> bool:
        for e in term.get("matchExpressions", []):
            val = self.node_labels.get(e["key"])
            op, values = e["operator"], e.get("values", [])
            ok = {
                "In": val is not None and val in values,
                "NotIn": val is None or val not in values,
                "Exists": val is not None,
                "DoesNotExist": val is None,
                "Gt": val is not None and values and float(val) > float(values[0]),
                "Lt": val is not None and values and float(val) < float(values[0]),
            }.get(op, False)
            if not ok:
                return False
        return not term.get("matchFields") or all(
            f["key"] == "metadata.name" and (self.node_name in f.get("values", [])) == (f["operator"] == "In")
            for f in term["matchFields"]
        )

    def maybe_bind(self, pod: PodDict) -> None:
        md, spec = pod["metadata"], pod["spec"]
        if spec.get("schedulerName", "default-scheduler") != "default-scheduler" or spec.get("schedulingGates"):
            return
        if for_real_node(pod):
            return
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        why = self.fits(pod)
        ns, name = md["namespace"], md["name"]
        try:
            if why:
                if md["uid"] not in self._unschedulable_noted:
                    self._unschedulable_noted.add(md["uid"])
                    set_status(self.api, ns, name, lambda st: merge_condition(
                        st, "PodScheduled", "False", "Unschedulable", f"0/1 nodes are available: 1 {why}."))
                return
            self.api.post(f"/api/v1/namespaces/{ns}/pods/{name}/binding", {
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns, "uid": md["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
            })
        except ApiError as exc:
            if exc.status not in (404, 409):
                self.errors.append(f"bind {ns}/{name}: {exc}")

