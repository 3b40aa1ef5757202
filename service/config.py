"""Service settings, built once (from the environment, `CONVGATE_*`) and injected; never global."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.policy import Policy

EMBEDDED_HOME = Path(".convgate")
POLICY_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
INLINE_VERSION_PREFIX = "inline-"  # every inline policy's version starts with it; no configured one may


class KubernetesSettings(BaseModel):
    """How verification Jobs are built and where they queue. Resource figures are Kubernetes quantities."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = "convgate"
    local_queue: str = "convgate"
    priority_class: str | None = None
    image: str = "convgate:0.1.0"
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    service_account: str = "convgate-worker"
    database_secret: str = "convgate-database"
    database_secret_key: str = "url"
    # set: workers get this Secret's URL (the restricted worker login, `convgate db grant-worker`) plus
    # their attempt's own secret, never `database_secret`; unset: workers share the service's URL
    worker_database_secret: str | None = None
    worker_database_secret_key: str = "url"
    cpu_request: str = "2"
    cpu_limit: str = "2"
    memory_request: str = "8Gi"
    memory_limit: str = "8Gi"
    ephemeral_storage_request: str = "20Gi"
    ephemeral_storage_limit: str = "40Gi"
    scratch_size_limit: str = "40Gi"
    backoff_limit: int = Field(0, ge=0, description="pod retries inside one Job; convgate retries attempts itself")
    active_deadline_seconds: int = Field(6 * 3600, ge=60)
    ttl_seconds_after_finished: int = Field(3600, ge=0)
    max_jobs_in_flight: int = Field(200, ge=1, description="Jobs created and not finished; Kueue admits them")
    api_timeout_seconds: float = Field(10.0, gt=0)
    create_attempts: int = Field(4, ge=1)
    retry_backoff_seconds: float = Field(0.5, ge=0)
    node_selector: dict[str, str] = Field(default_factory=dict)
    # gate 1 of a large artifact runs in ceil(size / gate1_shard_bytes) pods (at most max_gate1_shards) of one
    # Indexed Job; the size is the submission's artifact_size, or the file's for a file:// URI
    gate1_shard_bytes: int = Field(16 << 30, ge=1 << 20, description="artifact bytes per gate-1 shard")
    max_gate1_shards: int = Field(4, ge=1, le=64, description="1 turns sharding off")
    shard_retries: int = Field(2, ge=0, le=10, description="pod retries per shard (Indexed Job backoffLimitPerIndex)")
    state_source: Literal["poll"] = Field("poll", description="how Job and Workload state is read")
    in_cluster: bool = True
    kubeconfig: Path | None = Field(None, description="when not in_cluster: this kubeconfig, else the default one")
    create_pause_seconds: float = Field(
        10.0, ge=0, description="after a Job create failed for good (e.g. Kueue down), claim nothing this long")
    refused_creates_before_failing: int = Field(
        3, ge=1, description="a verification whose Job the API server refuses (400/403/422) this often fails")
    deleted_job_grace_seconds: float = Field(
        30.0, ge=0, description="a dispatched verification whose Job never appeared is lost after this long")
    secret_mirrors: tuple[Path, ...] = Field(
        (), description="kubeconfigs of MultiKueue worker clusters: each restricted attempt's Secret is created "
        "there too (MultiKueue copies Jobs, not Secrets; service/dispatch/kube/secret_mirrors.py)")


class Settings(BaseSettings):
    """Defaults are the embedded deployment: SQLite, a local worker pool, file:// allowed."""

    model_config = SettingsConfigDict(env_prefix="CONVGATE_", env_nested_delimiter="__", frozen=True, extra="forbid")

    database_url: str = f"sqlite:///{EMBEDDED_HOME / 'convgate.db'}"
    dispatcher: Literal["local", "kubernetes", "none"] = Field(
        "local", description="'none' runs an API-only replica (another process dispatches)")
    concurrency: int = Field(1, ge=1, le=64)
    max_attempts: int = Field(3, ge=1, le=20)
    lease_seconds: float = Field(60.0, gt=0, description="a running attempt with no heartbeat for this long is dead")
    poll_seconds: float = Field(0.5, gt=0)
    cache_dir: Path = EMBEDDED_HOME / "cache"
    allow_file_uris: bool = True
    allowed_hosts: tuple[str, ...] | None = None
    allow_private_addresses: bool = Field(
        False, description="let https:// reach loopback and private addresses on every host (a platform whose "
        "stores all sit inside its network); trusted_hosts exempts named hosts only")
    trusted_hosts: tuple[str, ...] = Field((), description="hosts exempt from the address checks (internal mirrors)")
    hf_endpoint: str | None = None
    file_roots: tuple[Path, ...] = Field(
        (), description="file:// URIs must resolve (symlinks and .. followed) inside one of these; none: refused")
    fetch_attempts: int = Field(4, ge=1, le=10, description="tries per download before the attempt ends unjudged")
    fetch_backoff_seconds: float = Field(1.0, ge=0, description="first retry delay; doubles per try")
    fetch_max_backoff_seconds: float = Field(30.0, ge=0, description="longest retry delay (and Retry-After honoured)")
    policies: dict[str, Policy] = Field(
        default_factory=lambda: {"default": Policy()},
        description="named policies (JSON); submitters choose one by name, inline ones need role policy-author")
    metrics_public: bool = Field(True, description="False: /metrics needs an operator or admin token")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies are refused with 413")
    max_streams: int = Field(64, ge=1, le=10_000, description="event streams open on this server at once "
                             "(each polls the database); beyond it, 429")
    max_streams_per_principal: int = Field(8, ge=1, le=1000, description="event streams one token may hold open")
    # the server process (`convgate serve`, service/api/serving.py)
    api_threads: int = Field(40, ge=2, le=1000, description="pool threads for request units and streams' polls; "
                             "each holds at most one database connection")
    sqlite_busy_timeout_seconds: float = Field(30.0, gt=0, le=600, description="SQLite only: how long a write "
                                               "waits for another's lock before its request answers 503")
    header_timeout_seconds: float = Field(10.0, gt=0, description="a request's line and headers must arrive "
                                          "within this long of its first byte (or of the connection), else 408")
    body_timeout_seconds: float = Field(30.0, gt=0, description="a request's whole body must arrive within "
                                        "this long of its headers, else the connection is closed")
    shutdown_grace_seconds: float = Field(10.0, gt=0, description="on SIGTERM: open event streams end at once, "
                                          "requests in flight have this long before they are cancelled")
    # completion callbacks (service/callbacks.py): checked by the artifacts' URI policy, https only
    callback_http_origins: tuple[str, ...] = Field(
        (), description="origins (http://host:port) a callback may reach over plain http; anything else is https")
    callback_attempts: int = Field(6, ge=1, le=20, description="delivery attempts before a callback is given up")
    callback_backoff_seconds: float = Field(10.0, ge=0, description="first retry delay; doubles per attempt")
    callback_max_backoff_seconds: float = Field(3600.0, ge=0, description="longest retry delay")
    callback_timeout_seconds: float = Field(10.0, gt=0, description="one delivery's total deadline: connecting, "
                                            "sending, and reading the status and headers together")
    callback_workers: int = Field(4, ge=1, le=64, description="deliveries sent at once, at most one per receiver "
                                  "(scheme, host and port): a slow receiver holds one of them")
    signing_key_file: Path | None = Field(
        None, description="Ed25519 private key (PEM) that signs attestations; none: one generated under cache_dir")
    trusted_key_files: tuple[Path, ...] = Field(
        (), description="public keys (PEM) still trusted after a rotation: Ed25519 for attestations, ECDSA for "
        "model signatures")
    model_signing_key_file: Path | None = Field(
        None, description="ECDSA P-256 private key (PKCS#8 PEM) that signs the OpenSSF Model Signing signature of "
        "a GO artifact; none: one generated under cache_dir")
    publisher_key_files: tuple[Path, ...] = Field(
        (), description="ECDSA public keys (PEM) of publishers whose OpenSSF Model Signing signatures of sources "
        "and artifacts convgate checks; a submitter can name a signature, never a key")

    @field_validator("policies")
    @classmethod
    def _configured_policies(cls, value: dict[str, Policy]) -> dict[str, Policy]:
        """Names fit `configured:<name>`; no configured version looks like an inline one."""
        if not value:
            raise ValueError("configure at least one policy")
        for name, policy in value.items():
            if not POLICY_NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r} must match {POLICY_NAME.pattern}")
            if policy.version.startswith(INLINE_VERSION_PREFIX):
                raise ValueError(f"policy {name!r}: version {policy.version!r} starts with "
                                 f"{INLINE_VERSION_PREFIX!r}, which marks inline policies")
        return value
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
