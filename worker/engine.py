"""The verification engine: a request and a policy in, a `Report` out. No HTTP, no SQL, no printing."""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from worker.blockers import Blocker
from worker.digests import digest_tree, sha256_file
from worker.gates.storage import Progress, _no_progress, run_storage_gate
from worker.policy import Policy
from worker.report import FileDigest, GateResult, Report

GATE_NAMES = {1: "storage", 2: "runtime", 3: "release"}
ALWAYS_NOT_VERIFIED = (
    "retrieval quality against ground truth (only agreement with the reference model is measured)",
    "behaviour on inputs outside the verified text set",
    "quantized tensors written with an importance matrix cannot be reproduced and are reported as mismatches",
)
ENVIRONMENT_PACKAGES = ("convgate", "gguf", "numpy", "llama-cpp-python", "transformers", "torch", "tokenizers")


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    source: Path
    artifact: Path
    artifact_uri: str
    expected_sha256: str | None = None
    gates: frozenset[int] = frozenset({1, 2, 3})
    texts: tuple[str, ...] | None = None


def environment() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ENVIRONMENT_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _not_run(gate: int, why: str) -> tuple[GateResult, Blocker]:
    name = GATE_NAMES[gate]
    return (
        GateResult(name=name, status="not_run", details={"why": why}),
        Blocker(code="gate.not_run", gate="verifier", why=f"gate {gate} ({name}) was requested but {why}"),
    )


def verify(request: VerifyRequest, policy: Policy, progress: Progress = _no_progress) -> Report:
    """Run the requested gates. GO needs zero blockers; a requested gate that cannot run is a blocker."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    blockers: list[Blocker] = []
    gates: dict[str, GateResult] = {}
    sha = sha256_file(request.artifact, lambda done, total: progress("sha256", done, total))
    artifact = FileDigest(uri=request.artifact_uri, sha256=sha, size=request.artifact.stat().st_size)
    timings["sha256"] = time.perf_counter() - started
    digest_ok = request.expected_sha256 is None or request.expected_sha256.lower() == sha
    if not digest_ok:
        blockers.append(Blocker(code="artifact.sha256_mismatch", gate="input",
                                why=f"artifact sha256 is {sha}, expected {request.expected_sha256}; not used"))
    for gate in sorted(request.gates):
        if not digest_ok:
            gates[GATE_NAMES[gate]] = GateResult(name=GATE_NAMES[gate], status="not_run",
                                                 details={"why": "artifact digest mismatch"})
        elif gate == 1:
            result, gate_blockers = run_storage_gate(request.artifact, request.source, policy, progress)
            gates["storage"] = result
            timings["storage"] = result.seconds
            blockers.extend(gate_blockers)
        else:
            result, blocker = _not_run(gate, "is not implemented in this version")
            gates[result.name] = result
            blockers.append(blocker)
    not_verified = [f"gate {g} ({GATE_NAMES[g]}) was not requested" for g in (1, 2, 3) if g not in request.gates]
    not_verified.extend(ALWAYS_NOT_VERIFIED)
    files = [artifact]
    if request.source.is_dir():
        files.extend(digest_tree(request.source))
    timings["total"] = time.perf_counter() - started
    return Report(
        verdict="NO-GO" if blockers else "GO",
        blockers=blockers,
        gates=gates,
        policy={"values": policy.model_dump(mode="json"), "sha256": policy.sha256()},
        artifact=artifact,
        files=files,
        not_verified=not_verified,
        environment=environment(),
        timings=timings,
    )


__all__ = ["VerifyRequest", "environment", "verify"]
