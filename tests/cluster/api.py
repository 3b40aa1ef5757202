"""A small synchronous REST client for the test cluster (httpx, admin client certificate).

The tests themselves may use the `kubernetes` package (see `Cluster.kube_client()`); the harness
and the pod runner use this thin layer so that everything stays plain JSON dicts: discovery-based
paths for any kind, server-side apply, waiting, and list+watch with resourceVersion handling.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

FIELD_MANAGER = "convgate-tests"


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any, method: str, path: str):
        self.status = status
        self.body = body
        reason = body.get("message") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{method} {path}: HTTP {status}: {reason}")


class Api:
    def __init__(self, server: str, ca: Path, cert: Path | None = None, key: Path | None = None,
                 token: str | None = None, timeout: float = 30.0):
        ctx = ssl.create_default_context(cafile=str(ca))
        if cert and key:
            ctx.load_cert_chain(str(cert), str(key))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        self._ctx = ctx
        self._headers = headers
        self._timeout = timeout
        # trust_env=False: never send cluster traffic to an HTTP(S)_PROXY from the environment.
        self.http = httpx.Client(base_url=server, verify=ctx, headers=headers, timeout=timeout, trust_env=False)
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}
        self._lock = threading.Lock()
        self._watch_clients: set[httpx.Client] = set()

    def close(self) -> None:
        self.close_watches()
        self.http.close()

    def close_watches(self) -> None:
        """Interrupt every list_watch() blocked on its stream (call after setting its stop event)."""
        with self._lock:
            clients = list(self._watch_clients)
        for c in clients:
            c.close()

    # --- plain verbs -------------------------------------------------------------------------
    def request(self, method: str, path: str, *, body: Any = None, params: dict | None = None,
                content_type: str = "application/json", ok404: bool = False) -> Any:
        content = None
        headers = {}
        if body is not None:
            content = body if isinstance(body, (bytes, str)) else json.dumps(body)
            headers["Content-Type"] = content_type
        r = self.http.request(method, path, content=content, params=params, headers=headers)
        if r.status_code == 404 and ok404:
            return None
        try:
            data = r.json()
        except ValueError:
            data = r.text
        if r.status_code >= 400:
            raise ApiError(r.status_code, data, method, path)
        return data

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("POST", path, body=body, **kw)

    def put(self, path: str, body: Any, **kw: Any) -> Any:
        return self.request("PUT", path, body=body, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body=body, content_type="application/merge-patch+json")

    # --- discovery ---------------------------------------------------------------------------
    def _group_resources(self, api_version: str) -> dict[str, tuple[str, bool]]:
        with self._lock:
            if api_version not in self._resources:
                base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
                data = self.get(base)
                self._resources[api_version] = {
                    r["kind"]: (r["name"], r["namespaced"]) for r in data["resources"] if "/" not in r["name"]
                }
            return self._resources[api_version]

    def path(self, api_version: str, kind: str, name: str | None = None, namespace: str | None = None,
             subresource: str | None = None) -> str:
        try:
            plural, namespaced = self._group_resources(api_version)[kind]
        except KeyError:
            self._resources.pop(api_version, None)  # CRDs may have appeared since
            plural, namespaced = self._group_resources(api_version)[kind]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        p = base
        if namespaced:
            p += f"/namespaces/{namespace or 'default'}"
        p += f"/{plural}"
        if name:
            p += f"/{name}"
        if subresource:
            p += f"/{subresource}"
        return p

    def path_of(self, obj: dict[str, Any], subresource: str | None = None) -> str:
        md = obj["metadata"]
        return self.path(obj["apiVersion"], obj["kind"], md["name"], md.get("namespace"), subresource)

    # --- objects -----------------------------------------------------------------------------
    def apply(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Server-side apply (force), like `kubectl apply --server-side --force-conflicts`."""
        obj = dict(obj)
        if namespace and "namespace" not in obj["metadata"]:
            obj["metadata"] = {**obj["metadata"], "namespace": namespace}
        return self.request(
            "PATCH", self.path_of(obj), body=json.dumps(obj),
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def apply_yaml(self, text_or_path: str | Path, namespace: str | None = None) -> list[dict[str, Any]]:
        text = Path(text_or_path).read_text() if isinstance(text_or_path, Path) else text_or_path
        return [self.apply(d, namespace) for d in yaml.safe_load_all(text) if d]

    def create(self, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        ns = obj["metadata"].get("namespace", namespace)
        return self.post(self.path(obj["apiVersion"], obj["kind"], namespace=ns), obj)

    def read(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.get(self.path(api_version, kind, name, namespace), ok404=True)

    # --- waiting and watching ----------------------------------------------------------------
    @staticmethod
    def wait(what: str, check: Callable[[], Any], timeout: float = 60.0, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        last_exc: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = check()
                if value:
                    return value
                last_exc = None
            except Exception as exc:
                last_exc = exc
            time.sleep(interval)
        raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}" + (f": {last_exc}" if last_exc else ""))

    def list_watch(self, path: str, stop: threading.Event, params: dict | None = None
                   ) -> Iterator[tuple[str, dict[str, Any]]]:
        """("SYNC", list) once per (re)list, then ("ADDED"|"MODIFIED"|"DELETED", obj) events, until `stop`."""
        rv = None
        while not stop.is_set():
            if rv is None:
                data = self.get(path, params=params)
                rv = data["metadata"]["resourceVersion"]
                yield "SYNC", data
            q = {**(params or {}), "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
                 "timeoutSeconds": "30"}
            c = httpx.Client(base_url=self.server, verify=self._ctx, headers=self._headers,
                             timeout=httpx.Timeout(self._timeout, read=45.0), trust_env=False)
            with self._lock:
                self._watch_clients.add(c)
            try:
                with c, c.stream("GET", path, params=q) as r:
                    if r.status_code == 410:
                        rv = None
                        continue
                    if r.status_code >= 400:
                        raise ApiError(r.status_code, r.read().decode(), "WATCH", path)
                    for line in r.iter_lines():
                        if stop.is_set():
                            return
                        if not line:
                            continue
                        ev = json.loads(line)
                        typ, obj = ev["type"], ev["object"]
                        if typ == "ERROR":
                            if obj.get("code") == 410:
                                rv = None
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if typ == "BOOKMARK":
                            continue
                        yield typ, obj
            except ApiError:
                raise
            except Exception:  # transport errors, or the client closed by close_watches()
                if stop.is_set():
                    return
                time.sleep(0.5)
            finally:
                with self._lock:
                    self._watch_clients.discard(c)
