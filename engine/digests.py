"""sha256 and size of files, streamed in fixed-size chunks (never a whole file in memory)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path

from engine.errors import ConvgateError
from engine.report import FileDigest

CHUNK_BYTES = 4 << 20


class DigestStoppedError(ConvgateError):
    """A background digest was told to stop (its verification ended first); nobody reads its result."""

    code = "engine.digest_stopped"


def sha256_file(path: Path, progress: Callable[[int, int], None] | None = None,
                stop: threading.Event | None = None) -> str:
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            if stop is not None and stop.is_set():
                raise DigestStoppedError(str(path))
            digest.update(chunk)
            done += len(chunk)
            if progress:
                progress(done, total)
    return digest.hexdigest()


def digest_file(path: Path, uri: str | None = None, stop: threading.Event | None = None) -> FileDigest:
    """Named by the path as given (a hub snapshot's symlinks stay its file names, not blob ids)."""
    return FileDigest(uri=uri or path.absolute().as_uri(), sha256=sha256_file(path, stop=stop),
                      size=path.stat().st_size)


def digest_tree(root: Path, root_uri: str, stop: threading.Event | None = None) -> list[FileDigest]:
    """Digests of every regular file under `root`, in a stable order, each named `root_uri/relative path`:
    the URI the source was asked by, whatever local directory (a server's content store) holds it."""
    base = root_uri.rstrip("/")
    return [digest_file(p, f"{base}/{p.relative_to(root).as_posix()}", stop) for p in sorted(root.rglob("*"))
            if p.is_file()]


class TreeDigest:
    """`digest_tree` on a background thread, started at once; `result()` waits for it.

    Why: the source's digests are needed only for the report and the publishers' signatures, not to decide
    what the gates may read (the source is opened by our own strict parser first). Taken while the first
    gate reads the same files, one read from the disk serves both as long as the page cache holds what the
    one ahead has read; taken before, a source larger than the page cache is read from the disk twice (a
    7B BF16 source: 13.5 GB, ~35 s on a disk read at 400 MB/s, with the CPU idle)."""

    def __init__(self, root: Path, root_uri: str) -> None:
        self._stop = threading.Event()
        self._found: list[FileDigest] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._digest, args=(root, root_uri), name="convgate-source-digest",
                                        daemon=True)
        self._thread.start()

    def _digest(self, root: Path, root_uri: str) -> None:
        try:
            self._found = digest_tree(root, root_uri, self._stop)
        except BaseException as exc:  # handed to the caller by result(), as if it had digested the tree itself
            self._error = exc

    def result(self) -> list[FileDigest]:
        """The digests, or the error the digest raised (an unreadable file), once the thread has ended."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._found

    def stop(self) -> None:
        """End the digest early: the verification ended without needing it (a crash, a cancelled attempt)."""
        self._stop.set()
