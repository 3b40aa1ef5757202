"""Reports as the engine writes them (with each storage-gate tensor row's `data_sha256`), over real
files in a temporary folder, so an attestation's subjects can be checked against the bytes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.digests import digest_file

TENSORS = {"token_embd.weight": b"\x01\x02" * 64, "blk.0.attn_q.weight": b"\x03\x04" * 64,
           "output_norm.weight": b"\x05" * 32}


@dataclass(frozen=True)
class ReportFiles:
    artifact: Path
    source_files: tuple[Path, ...]
    imatrix: Path

    @property
    def all(self) -> tuple[Path, ...]:
        return (self.artifact, *self.source_files, self.imatrix)


def write_files(root: Path) -> ReportFiles:
    source = root / "source"
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.json").write_text('{"model_type": "bert"}')
    (source / "model.safetensors").write_bytes(b"\x00" * 40 + b"weights")
    artifact = root / "model-Q8_0.gguf"
    artifact.write_bytes(b"GGUF" + b"".join(TENSORS.values()))
    imatrix = root / "imatrix.gguf"
    imatrix.write_bytes(b"GGUF imatrix")
    return ReportFiles(artifact, (source / "config.json", source / "model.safetensors"), imatrix)


def tensor_rows(*, reverse: bool = False, with_digest: bool = True) -> list[dict[str, Any]]:
    rows = []
    for name, data in TENSORS.items():
        row = {"gguf_name": name, "source_names": [name], "transform": None, "gguf_type": "F16",
               "source_dtype": "F32", "shape": [len(data) // 2], "check": "bit-exact", "max_abs": 0.0,
               "rel_l2": 0.0, "mismatched": 0, "result": "ok"}
        if with_digest:
            row["data_sha256"] = hashlib.sha256(data).hexdigest()
        rows.append(row)
    return rows[::-1] if reverse else rows


def report(files: ReportFiles, *, verdict: str = "GO", reverse: bool = False, with_digest: bool = True,
           environment: dict[str, str] | None = None) -> dict[str, Any]:
    artifact = digest_file(files.artifact).model_dump()
    blockers = [] if verdict == "GO" else [
        {"code": "tensor.value_mismatch", "gate": "storage", "why": "differs", "tensor": "token_embd.weight",
         "text": None}]
    return {
        "verdict": verdict, "blockers": blockers,
        "gates": {"storage": {"name": "storage", "status": "passed" if verdict == "GO" else "failed", "seconds": 1.0,
                              "details": {"tensors": tensor_rows(reverse=reverse, with_digest=with_digest)}},
                  "runtime": {"name": "runtime", "status": "passed", "seconds": 2.0, "details": {}},
                  "release": {"name": "release", "status": "not_run", "seconds": 0.0, "details": {}}},
        "policy": {"values": {"version": "v1", "tie_ulps": 4}, "sha256": "a" * 64},
        "artifact": artifact,
        "files": [artifact, *(digest_file(p).model_dump() for p in (*files.source_files, files.imatrix))],
        "not_verified": ["gate 3 (release) was not requested", "retrieval quality against ground truth"],
        "environment": environment if environment is not None else {
            "python": "3.11.9", "convgate": "0.1.0", "gguf": "0.19.0", "llama-cpp-python": "0.3.36",
            "transformers": "4.57.6", "torch": "2.13.0"},
        "timings": {"total": 3.0},
    }
