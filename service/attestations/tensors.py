"""A recipient's GGUF against the statement's per-tensor digests: each tensor's stored bytes, found
through our own bounded parser (never gguf-py on an untrusted file), by name, so a file whose header
lists the same tensors in another order still checks tensor by tensor."""

from __future__ import annotations

import hashlib
from pathlib import Path

from engine.formats.gguf_structure import GGUFStructureError, read_layout
from service.attestations.statement import Statement

CHUNK_BYTES = 4 << 20


def tensor_sha256(path: Path, offset: int, nbytes: int) -> str | None:
    """sha256 of `nbytes` at `offset`, streamed; None when the file ends first (it changed since it was parsed)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        handle.seek(offset)
        left = nbytes
        while left:
            chunk = handle.read(min(CHUNK_BYTES, left))
            if not chunk:
                return None
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest()


def check_tensors(statement: Statement, gguf: Path) -> list[str]:
    """One line per tensor that differs, is missing or is extra; empty when every tensor matches."""
    attested = statement.predicate.tensor_data_sha256
    if not attested:
        return [f"{gguf}: the statement carries no tensor digests to check against"]
    try:
        layout = read_layout(gguf)
    except GGUFStructureError as exc:
        return [f"{gguf}: not a valid GGUF ({exc})"]
    problems = []
    present = set()
    for tensor in layout.tensors:
        present.add(tensor.name)
        expected = attested.get(tensor.name)
        if expected is None:
            problems.append(f"{gguf}: tensor {tensor.name} is not in the statement")
            continue
        actual = tensor_sha256(gguf, tensor.offset, tensor.nbytes)
        if actual is None:
            problems.append(f"{gguf}: the file ends inside tensor {tensor.name}")
        elif actual != expected:
            problems.append(f"{gguf}: tensor {tensor.name} data sha256 {actual} differs from the statement's "
                            f"{expected}")
    problems.extend(f"{gguf}: tensor {name} is missing" for name in sorted(set(attested) - present))
    return problems
