"""Fixtures for tests against a real control plane (see tests/cluster/cluster.py).

`cluster` starts etcd, kube-apiserver, kube-controller-manager and Kueue once per session; `node`
adds a real node (containerd, runc, CNI, kubelet, kube-scheduler, kube-proxy: tests/cluster/node.py);
`pod_runner` plays the kubelet for the scenarios that need an injected fault. All are torn down at
the end of the session. The binaries must have been built by `python3 scripts/build_kube.py`
(cached by version outside the repo); without them the tests are skipped, which
`python3 dev.py test` (CONVGATE_STRICT_SKIPS=1) turns into failures.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from .cluster import Cluster, find_binaries
from .node import KubeNode, check_node_binaries, find_node_dir
from .pod_runner import PodRunner

NODE_LABELS = {"convgate.io/node-pool": "cpu"}  # manifests/kueue/resource-flavor.yaml's nodeLabels


def pytest_configure(config: pytest.Config) -> None:
    # registered here too so that --strict-markers accepts the marker before pyproject lists it
    config.addinivalue_line("markers", "cluster: needs the real control plane built by scripts/build_kube.py")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    try:
        bindir = find_binaries()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    c = Cluster.start(bindir)
    print(f"\ncluster started in {c.timings['total']:.1f}s: {c.describe()}", file=sys.stderr)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def node(cluster: Cluster) -> Iterator[KubeNode]:
    """The real node, Ready, with the pause and busybox images loaded (`node.busybox`)."""
    try:
        check_node_binaries(cluster.bindir)
        nodedir = find_node_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    n = KubeNode.start(cluster, nodedir)
    print(f"\nnode started in {n.timings['total']:.1f}s: {n.describe()}", file=sys.stderr)
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="session")
def pod_runner(cluster: Cluster) -> Iterator[PodRunner]:
    runner = PodRunner(
        cluster.api,
        node_name="convgate-node",
        node_labels=NODE_LABELS,
        workdir=cluster.workdir / "pods",
        api_port=cluster.api_port,
    )
    runner.start()
    try:
        yield runner
    finally:
        runner.stop()


# Postgres for convgate on the cluster: the service tests' throwaway database (migrated once per
# session, emptied per test by `pg`)
from tests.service.conftest import pg, pg_url  # noqa: E402, F401
