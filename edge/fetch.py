"""URIs to local files: `file://` (inside the allowed roots, hashed in place), `https://` (streamed
into the content-addressed cache) and `hf://` (a pinned commit, see `edge.hub`). A file whose digest
differs from the expected one is deleted and never used."""

from __future__ import annotations

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
