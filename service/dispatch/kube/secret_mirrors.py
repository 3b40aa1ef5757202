"""Each attempt's Secret, also in the MultiKueue worker clusters.

MultiKueue copies a Job to the worker cluster that runs it, not the Secrets its pods name. A restricted
worker's attempt secret (job_manifest.attempt_secret_name) would stay in the manager and the pod would
start without it, unable to report; giving worker clusters the service's own database URL instead would
hand the control plane's credentials to the clusters that parse hostile files. So the dispatcher creates
the attempt's Secret in every worker cluster it is given a kubeconfig for (which one MultiKueue picks is
not known when the Job is created) and deletes it there when the attempt's Job finishes or is cancelled.
In the worker clusters the Secret has no owner (the copied Job's uid is not known), so those deletes are
what removes it; a delete that fails is logged and left to the next attempt's launch, which deletes the
previous attempt's Secret too. The identity needs `create` and `delete` on Secrets in the namespace only
(the chart's `topology: worker` renders that Role)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import config as k8s_config

from service.dispatch.kube.errors import is_already_exists, is_not_found, translate

log = logging.getLogger("convgate.kubernetes")


class SecretMirrors:
    def __init__(self, kubeconfigs: tuple[Path, ...], namespace: str, timeout: float) -> None:
        self.namespace, self.timeout = namespace, timeout
        self.clients = [k8s_config.new_client_from_config(config_file=str(path)) for path in kubeconfigs]
        self.cores = [(str(path), k8s.CoreV1Api(api)) for path, api in zip(kubeconfigs, self.clients, strict=True)]

    def create(self, secret: dict[str, Any]) -> None:
        """The same Secret, without its owner, in every worker cluster; raises a KubeError on any refusal."""
        body = {**secret, "metadata": {k: v for k, v in secret["metadata"].items() if k != "ownerReferences"}}
        for where, core in self.cores:
            try:
                core.create_namespaced_secret(self.namespace, cast(Any, body), _request_timeout=self.timeout)
            except Exception as exc:
                if not is_already_exists(exc):  # an earlier try of the same attempt created it
                    raise translate(exc, f"create secret {body['metadata']['name']} in {where}") from exc

    def delete(self, name: str) -> None:
        """Best effort: a Secret left behind is only a credential for an attempt that can no longer write."""
        for where, core in self.cores:
            try:
                core.delete_namespaced_secret(name, self.namespace, _request_timeout=self.timeout)
            except Exception as exc:
                if not is_not_found(exc):  # unreachable, refused: logged, never raised into the tick
                    log.warning("could not delete secret %s in %s: %s: %s", name, where, type(exc).__name__, exc)

    def close(self) -> None:
        for api in self.clients:
            api.close()
