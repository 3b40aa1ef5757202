"""sha256 and size of files, streamed in fixed-size chunks (never a whole file in memory)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from engine.report import FileDigest

CHUNK_BYTES = 4 << 20


def sha256_file(path: Path, progress: Callable[[int, int], None] | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def digest_file(path: Path, uri: str | None = None) -> FileDigest:
    """Named by the path as given (a hub snapshot's symlinks stay its file names, not blob ids)."""
    return FileDigest(uri=uri or path.absolute().as_uri(), sha256=sha256_file(path), size=path.stat().st_size)


def digest_tree(root: Path, root_uri: str) -> list[FileDigest]:
    """Digests of every regular file under `root`, in a stable order, each named `root_uri/relative path`:
    the URI the source was asked by, whatever local directory (a server's content store) holds it."""
    base = root_uri.rstrip("/")
    return [digest_file(p, f"{base}/{p.relative_to(root).as_posix()}") for p in sorted(root.rglob("*"))
            if p.is_file()]
