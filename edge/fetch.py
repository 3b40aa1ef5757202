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
from edge.file_roots import OutsideRootsError, check_tree, file_uri_path
from edge.hub import Hub, fetch_hf_file, fetch_hf_snapshot
from edge.redact import redact_uri
from edge.store import ContentStore
from edge.uri_policy import UriRefusedError, hf_parts
from engine.formats.artifact_files import sibling_uri, split_shard_uris
from engine.formats.gguf_split import shard_name


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
    if scheme == "hf":
        repo, revision, in_repo = _hf(uri)
        if not in_repo:
            raise FetchError("artifact.fetch_failed", "an hf:// artifact URI is hf://owner/repo@<40-hex commit>/path")
        return fetch_hf_file(Hub(repo, revision, policy), in_repo, expected, store, progress)
    raise FetchError("artifact.fetch_failed", f"unsupported URI scheme {scheme!r}")


def _hf(uri: str) -> tuple[str, str, str | None]:
    """`hf_parts`, its refusal a definitive FetchError: checked again here, in the worker, as at submission."""
    try:
        return hf_parts(uri)
    except UriRefusedError as exc:
        raise FetchError("artifact.fetch_failed", f"refused: {exc}") from exc


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
    if _scheme(uri) != "hf":
        raise FetchError("artifact.fetch_failed", "a source URI is a directory or hf://owner/repo@<40-hex commit>")
    repo, revision, in_repo = _hf(uri)
    if in_repo:
        raise FetchError("artifact.fetch_failed", "a source URI is a directory or hf://owner/repo@<40-hex commit>")
    return fetch_hf_snapshot(Hub(repo, revision, policy), store)


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
    return _linked(store, "\n".join((uri, *shard_sha256)), names, paths)


def _linked(store: ContentStore, key: str, names: list[str], paths: list[Path]) -> Path:
    """Links `names` to `paths` in a folder of the store keyed by `key`; the first link. Each link is made
    under a temporary name and renamed over the old one, so a run reading the folder never sees one missing."""
    folder = store.root / "splits" / hashlib.sha256(key.lower().encode()).hexdigest()
    folder.mkdir(parents=True, exist_ok=True)
    for linked, path in zip(names, paths, strict=True):
        temp = folder / f".{linked}.{os.getpid()}"
        temp.unlink(missing_ok=True)
        temp.symlink_to(path)
        os.replace(temp, folder / linked)
    return folder / names[0]


def named_local_split(uri: str, policy: FetchPolicy, store: ContentStore) -> Path | None:
    """A local split named by one of its shards and pinned by no digest (the CLI's way: its first shard's
    path, the others beside it): every shard judged by the roots like any file (FetchError for one outside),
    reached through links under its published name. None for a URI that names no shard of a split."""
    if _scheme(uri) not in ("", "file"):
        return None
    try:
        name = shard_name(file_uri_path(uri))
    except OutsideRootsError as exc:
        raise FetchError("artifact.fetch_failed", f"refused: {exc}") from exc
    if name is None or name.count < 2:
        return None
    names = [name.sibling(number) for number in range(1, name.count + 1)]
    paths = [local_file(sibling_uri(uri, shard), policy, must_exist=False) for shard in names]
    linked = _linked(store, "local\n" + uri, names, paths)
    return linked.with_name(names[name.number - 1])


PLAIN_NAME = "artifact.gguf"


def one_file(path: Path, store: ContentStore) -> Path:
    """`path`, an artifact fetched as one file, as the engine must see it: one file. The engine finds a
    split's shards beside its first by the first's name, so a file whose name implies a split (its own, or
    that of the file a symlink led to: `model.gguf -> x-00001-of-00002.gguf`) is handed over through a link
    with a plain name; its "siblings" are never read, whatever they are and wherever they lead. A split is
    declared with every shard's digest (`fetch_split_artifact`)."""
    implied = shard_name(path)
    if implied is None or implied.count < 2:
        return path
    return _linked(store, f"one\n{path}", [PLAIN_NAME], [path])
