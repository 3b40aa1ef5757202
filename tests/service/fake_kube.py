"""A local server that answers as the Kubernetes API (batch/v1 Jobs, Kueue v1beta2 Workloads, the
visibility API) and records every request, so the official client is tested at its HTTP boundary."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Recorded:
    method: str
    path: str  # exactly as it went out, still percent-encoded
    query: dict[str, list[str]]
    body: Any


@dataclass
class FakeCluster:
    namespace: str = "convgate"
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)  # by job name
    pending: list[str] = field(default_factory=list)  # job names, in LocalQueue order
    requests: list[Recorded] = field(default_factory=list)
    create_faults: list[int | float] = field(default_factory=list)  # HTTP status, or seconds of delay
    # every visibility call answers this while set: an HTTP status, seconds of delay, or a raw body
    visibility_fault: int | float | bytes | None = None
    secrets: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def status(self, code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                      "message": message, "reason": reason, "code": code}

    def refusal(self, code: int) -> tuple[int, dict[str, Any]]:
        """What the API server sends for `code`: a quota or RBAC refusal, a webhook denial, an invalid
        spec, or a transient failure (the Status `reason` is the typed part)."""
        known = {
            400: ("BadRequest", 'admission webhook "vjob.example.io" denied the request: team label missing'),
            403: ("Forbidden", 'jobs.batch "x" is forbidden: exceeded quota: convgate-jobs, requested: '
                               "count/jobs.batch=1, used: count/jobs.batch=50, limited: count/jobs.batch=50"),
            422: ("Invalid", 'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value'),
            429: ("TooManyRequests", "too many requests, please try again later"),
        }
        reason, message = known.get(code, ("InternalError", "etcdserver: request timed out"))
        return self.status(code, reason, message)

    def create_job(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body["metadata"]["name"]
        if name in self.jobs:
            return self.status(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
        job = json.loads(json.dumps(body))
        job["metadata"] |= {"uid": str(uuid.uuid4()), "resourceVersion": "1",
                            "creationTimestamp": "2026-11-29T10:00:00Z"}
        job["status"] = {}
        self.jobs[name] = job
        self.pending.append(name)
        return 201, job

    def set_workload(self, job_name: str, *conditions: tuple[str, str]) -> None:
        """Give the Job's Workload these true conditions, e.g. ("Evicted", "Preempted")."""
        job = self.jobs[job_name]
        self.workloads[job_name] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{job_name}-abcde", "namespace": self.namespace,
                         "labels": {"kueue.x-k8s.io/job-uid": job["metadata"]["uid"]},
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                              "uid": job["metadata"]["uid"]}]},
            "spec": {"queueName": job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"], "podSets": []},
            "status": {"conditions": [
                {"type": kind, "status": "True", "reason": reason, "message": reason,
                 "lastTransitionTime": "2026-11-29T10:00:00Z", "observedGeneration": 1}
                for kind, reason in conditions]},
        }
        if any(kind in ("Admitted", "QuotaReserved", "Finished") for kind, _ in conditions):
            self.pending = [n for n in self.pending if n != job_name]
            job["spec"]["suspend"] = False

    def set_job_condition(self, job_name: str, kind: str, reason: str = "") -> None:
        self.jobs[job_name]["status"]["conditions"] = [{"type": kind, "status": "True", "reason": reason}]

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        base = f"/apis/batch/v1/namespaces/{self.namespace}/jobs"
        if path == base and method == "POST":
            fault = self.create_faults.pop(0) if self.create_faults else None
            if isinstance(fault, float):
                time.sleep(fault)
            elif isinstance(fault, int):
                return self.refusal(fault)
            return self.create_job(body)
        if path.startswith(base + "/") and method == "GET":
            job = self.jobs.get(path.rsplit("/", 1)[1])
            return (200, job) if job is not None else self.status(404, "NotFound", "job not found")
        secrets = f"/api/v1/namespaces/{self.namespace}/secrets"
        if path == secrets and method == "POST":
            name = body["metadata"]["name"]
            if name in self.secrets:
                return self.status(409, "AlreadyExists", f'secrets "{name}" already exists')
            self.secrets[name] = body
            return 201, body
        if path.startswith(secrets + "/") and method == "DELETE":
            name = path.rsplit("/", 1)[1]
            if self.secrets.pop(name, None) is None:
                return self.status(404, "NotFound", f'secrets "{name}" not found')
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}
        if path == base and method == "GET":
            return 200, {"apiVersion": "batch/v1", "kind": "JobList", "metadata": {"resourceVersion": "7"},
                         "items": list(self.jobs.values())}
        if path.startswith(base + "/") and method == "DELETE":
            name = path.rsplit("/", 1)[1]
            if self.jobs.pop(name, None) is None:
                return self.status(404, "NotFound", f'jobs.batch "{name}" not found')
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": name}}
        if path == f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{self.namespace}/workloads" and method == "GET":
            return 200, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadList", "metadata": {},
                         "items": list(self.workloads.values())}
        if path == f"/api/v1/namespaces/{self.namespace}/pods" and method == "GET":
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": []}
        visibility = f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{self.namespace}/localqueues/"
        if path.startswith(visibility) and path.endswith("/pendingworkloads") and method == "GET":
            fault = self.visibility_fault
            if isinstance(fault, float):
                time.sleep(fault)
            elif isinstance(fault, bytes):
                return 200, fault
            elif isinstance(fault, int):
                return self.status(fault, "ServiceUnavailable", "the server is currently unable to handle the request")
            items = [{"metadata": {"name": f"job-{name}-abcde", "namespace": self.namespace,
                                   "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                        "uid": self.jobs[name]["metadata"]["uid"]}]},
                      "priority": 0, "localQueueName": path[len(visibility):].split("/", maxsplit=1)[0],
                      "positionInClusterQueue": i, "positionInLocalQueue": i}
                     for i, name in enumerate(n for n in self.pending if n in self.jobs)]
            return 200, {"kind": "PendingWorkloadsSummary", "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
                         "metadata": {}, "items": items}
        return self.status(404, "NotFound", f"no route for {method} {path}")


def serve(cluster: FakeCluster) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            return None

        def _handle(self) -> None:
            parsed = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            query = parse_qs(parsed.query)
            with cluster.lock:
                cluster.requests.append(Recorded(self.command, parsed.path, query, body))
            status, payload = cluster.answer(self.command, parsed.path, query, body)
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _handle  # noqa: N815 (http.server's method names)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
