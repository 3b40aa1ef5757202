"""Service settings, built once (from the environment, `CONVGATE_*`) and injected; never global."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker.policy import Policy

EMBEDDED_HOME = Path(".convgate")


class Settings(BaseSettings):
    """Defaults are the embedded deployment: SQLite, a local worker pool, file:// allowed."""

    model_config = SettingsConfigDict(env_prefix="CONVGATE_", frozen=True, extra="forbid")

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
    allow_private_addresses: bool = Field(False, description="testing only: let https:// reach loopback/private")
    trusted_hosts: tuple[str, ...] = Field((), description="hosts exempt from the address checks (internal mirrors)")
    hf_endpoint: str | None = None
    policies: dict[str, Policy] = Field(default_factory=lambda: {"default": Policy()})
    metrics_public: bool = True
