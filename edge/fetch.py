"""URIs to local files: `file://` (inside the allowed roots, hashed in place), `https://` (streamed
into the content-addressed cache) and `hf://` (a pinned commit, see `edge.hub`). A file whose digest
differs from the expected one is deleted and never used."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from edge.download import FetchPolicy, download
from edge.errors import FetchError
from edge.file_roots import OutsideRootsError, check_tree
from edge.hub import Hub, fetch_hf_file, fetch_hf_snapshot
from edge.redact import redact_uri
from edge.store import ContentStore
from edge.uri_policy import HF_URI, UriRefusedError
from worker.formats.artifact_files import split_shard_uris
from worker.formats.gguf_split import shard_name


def _mismatch(actual: str, expected: str) -> FetchError:
    return FetchError("artifact.sha256_mismatch", f"sha256 is {actual}, expected {expected}; the file is not used")


def local_file(uri: str, policy: FetchPolicy, *, must_exist: bool = True) -> Path:
    """A `file://` URI (or plain path) resolved inside the allowed roots, else a definitive FetchError."""
    try:
        return policy.uris.local_path(uri, must_exist=must_exist)
    except UriRefusedError as exc:
        raise FetchError("artifact.fetch_failed", f"refused: {exc}") from exc


def _scheme(uri: str) -> str:
    """The scheme of `uri`; a URI `urlsplit` refuses is a blocker whose message quotes it redacted, never
    the parser's own message (which repeats the offending piece: a bracketed host, a port)."""
    try:
        return urlsplit(uri).scheme
    except ValueError:
        raise FetchError("artifact.fetch_failed", f"{redact_uri(uri)}: not a URL") from None


def fetch_artifact(uri: str, expected: str | None, store: ContentStore, policy: FetchPolicy,
                   progress: Callable[[int, int], None] = lambda done, total: None) -> Path:
    """A local path holding exactly the bytes of `uri` (and of `expected`, when given)."""
    scheme = _scheme(uri)
    if scheme in ("", "file"):
        path = local_file(uri, policy, must_exist=False)
        if not path.is_file():
            raise FetchError("artifact.unreadable", f"{path} is not a readable file")
        return path
    if (cached := store.cached(expected)) is not None:
        return cached
    if scheme == "https":
        temp = store.temp_file()
        actual = download(uri, temp, policy, progress)
        if expected is not None and actual != expected.lower():
            temp.unlink(missing_ok=True)
            raise _mismatch(actual, expected)
        return store.admit(temp, actual)
    if (match := HF_URI.match(uri)) is not None and match["path"]:
        return fetch_hf_file(Hub(match["repo"], match["rev"], policy), match["path"], expected, store, progress)
    if scheme == "hf":
        raise FetchError("artifact.fetch_failed", "an hf:// artifact URI is hf://owner/repo@<40-hex commit>/path")
    raise FetchError("artifact.fetch_failed", f"unsupported URI scheme {scheme!r}")


def fetch_source(uri: str, store: ContentStore, policy: FetchPolicy) -> Path:
    """A local model directory: `file://` inside the roots (every entry too), or an hf:// snapshot."""
    if _scheme(uri) in ("", "file"):
        path = local_file(uri, policy, must_exist=False)
        if not path.is_dir():
            raise FetchError("source.missing", f"{path} is not a directory")
        try:
            check_tree(path, policy.uris.file_roots)
        except OutsideRootsError as exc:
            raise FetchError("artifact.fetch_failed", f"refused: a source entry leaves the roots: {exc}") from exc
        return path
    match = HF_URI.match(uri)
    if match is None or match["path"]:
        raise FetchError("artifact.fetch_failed", "a source URI is a directory or hf://owner/repo@<40-hex commit>")
    return fetch_hf_snapshot(Hub(match["repo"], match["rev"], policy), store)


def fetch_split_artifact(uri: str, shard_sha256: tuple[str, ...], store: ContentStore, policy: FetchPolicy,
                         progress: Callable[[int, int], None] = lambda done, total: None) -> Path:
    """A gguf-split named by its first shard's URI: the local path of the first shard with every sibling beside
    it under its published name, as llama.cpp opens them.

    The siblings' URIs are the first's with the shard's file name (`-0000k-of-0000n.gguf`). Fetched shards are
    fetched by their own digests; `file://` shards are each checked against the roots like any file (their
    digests are checked by the engine). Either way the shards are reached through a folder of links keyed by
    the URI and every digest, so a shard stored under another name (the content store, a hub cache's blobs) is
    still found where llama.cpp looks. A shard that cannot be had leaves its link dangling: the engine names it
    a missing shard."""
    name = shard_name(Path(urlsplit(uri).path))
    count = len(shard_sha256)
    if name is None or name.number != 1 or name.count != count:
        raise FetchError("artifact.split_index_mismatch",
                         f"{redact_uri(uri)} does not name the first of {count} shards (-00001-of-{count:05d}.gguf)")
    uris = [uri, *split_shard_uris(uri, count)]
    names = [name.sibling(number) for number in range(1, count + 1)]
    if _scheme(uri) in ("", "file"):
        paths = [local_file(shard_uri, policy, must_exist=False) for shard_uri in uris]
    else:
        paths = [fetch_artifact(shard_uri, sha, store, policy, progress)
                 for shard_uri, sha in zip(uris, shard_sha256, strict=True)]
    key = hashlib.sha256("\n".join((uri, *shard_sha256)).lower().encode()).hexdigest()
    folder = store.root / "splits" / key
    folder.mkdir(parents=True, exist_ok=True)
    for shard, path in zip(names, paths, strict=True):
        temp = folder / f".{shard}.{os.getpid()}"
        temp.unlink(missing_ok=True)
        temp.symlink_to(path)
        os.replace(temp, folder / shard)  # atomic: a run reading the folder never sees a link missing
    return folder / names[0]
