"""Artifact and source fetching by URI, into a content-addressed cache keyed by sha256.

`file://` (and plain paths) are hashed in place; `https://` is streamed with httpx under a size
limit, following redirects by hand so every hop is re-checked; `hf://owner/repo@<40-hex>/path`
goes through huggingface_hub with the revision pinned, and the LFS sha256 the hub reports is
compared too. A file whose digest differs from the expected one is deleted and never used.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

from worker.digests import CHUNK_BYTES, sha256_file
from worker.errors import CodedError

HF_URI = re.compile(r"^hf://(?P<repo>[\w.-]+/[\w.-]+)@(?P<rev>[0-9a-f]{40})(?:/(?P<path>.+))?$")
MAX_REDIRECTS = 5


class FetchError(CodedError):
    """The URI could not be turned into a verified local file; `code` is a blocker code."""


@dataclass(frozen=True, kw_only=True)
class FetchPolicy:
    """What may be fetched. `allowed_hosts=None` allows any host (the URI policy of the service
    narrows this further); `verify` is passed to httpx (an SSLContext trusting a test CA in tests)."""

    allow_file: bool = True
    allowed_hosts: tuple[str, ...] | None = None
    max_bytes: int = 200 * 2**30
    timeout_s: float = 60.0
    verify: bool | ssl.SSLContext = True
    hf_endpoint: str | None = None
    check_url: Callable[[str], None] | None = None


@dataclass(frozen=True)
class ContentStore:
    """Files stored under their own sha256: `root/sha256/ab/abcdef...`."""

    root: Path

    def path_for(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def temp_file(self) -> Path:
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.root / "tmp")
        os.close(handle)
        return Path(name)

    def admit(self, temp: Path, sha256: str) -> Path:
        target = self.path_for(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temp, target)
        return target

    def cached(self, expected: str | None) -> Path | None:
        if expected is None:
            return None
        path = self.path_for(expected.lower())
        return path if path.is_file() and sha256_file(path) == expected.lower() else None


def _mismatch(actual: str, expected: str) -> FetchError:
    return FetchError("artifact.sha256_mismatch", f"sha256 is {actual}, expected {expected}; the file is not used")


def _check_hop(url: str, policy: FetchPolicy) -> None:
    parsed = urlparse(url)
    if parsed.scheme != "https":
        raise FetchError("artifact.fetch_failed", f"refusing {parsed.scheme!r} URL {url} (only https)")
    if policy.allowed_hosts is not None and parsed.hostname not in policy.allowed_hosts:
        raise FetchError("artifact.fetch_failed", f"host {parsed.hostname!r} is not allowed")
    if policy.check_url is not None:
        policy.check_url(url)


def _fetch_https(url: str, expected: str | None, store: ContentStore, policy: FetchPolicy,
                 progress: Callable[[int, int], None]) -> Path:
    import httpx

    temp = store.temp_file()
    digest = hashlib.sha256()
    try:
        with httpx.Client(follow_redirects=False, timeout=policy.timeout_s, verify=policy.verify) as client:
            for _ in range(MAX_REDIRECTS + 1):
                _check_hop(url, policy)
                with client.stream("GET", url) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers["location"])
                        continue
                    response.raise_for_status()
                    total = int(response.headers.get("content-length") or 0)
                    if total > policy.max_bytes:
                        raise FetchError("artifact.fetch_failed", f"{total} bytes exceed the {policy.max_bytes} limit")
                    done = 0
                    with temp.open("wb") as out:
                        for chunk in response.iter_bytes(CHUNK_BYTES):
                            done += len(chunk)
                            if done > policy.max_bytes:
                                raise FetchError("artifact.fetch_failed", f"more than {policy.max_bytes} bytes")
                            digest.update(chunk)
                            out.write(chunk)
                            progress(done, total)
                    break
            else:
                raise FetchError("artifact.fetch_failed", f"more than {MAX_REDIRECTS} redirects")
    except httpx.HTTPError as exc:
        temp.unlink(missing_ok=True)
        raise FetchError("artifact.fetch_failed", f"{url}: {type(exc).__name__}: {exc}") from exc
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    actual = digest.hexdigest()
    if expected is not None and actual != expected.lower():
        temp.unlink(missing_ok=True)
        raise _mismatch(actual, expected)
    return store.admit(temp, actual)


def _fetch_hf(match: re.Match[str], expected: str | None, store: ContentStore, policy: FetchPolicy) -> Path:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError

    repo, revision, path = match["repo"], match["rev"], match["path"]
    if not path:
        raise FetchError("artifact.fetch_failed", "an hf:// artifact URI must name a file")
    try:
        infos = HfApi(endpoint=policy.hf_endpoint).get_paths_info(repo, [path], revision=revision)
        lfs = next((lfs for info in infos if (lfs := getattr(info, "lfs", None)) is not None), None)
        lfs_sha = lfs.sha256 if lfs is not None else None
        store.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=store.root) as scratch:
            local = Path(hf_hub_download(repo, path, revision=revision, cache_dir=scratch,
                                         endpoint=policy.hf_endpoint)).resolve()  # the blob, not the link
            actual = sha256_file(local)
            if lfs_sha is not None and actual != lfs_sha:
                raise _mismatch(actual, f"{lfs_sha} (the hub's LFS digest)")
            if expected is not None and actual != expected.lower():
                raise _mismatch(actual, expected)
            temp = store.temp_file()
            shutil.move(local, temp)
            return store.admit(temp, actual)
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise FetchError("artifact.fetch_failed", f"hf://{repo}@{revision}/{path}: {exc}") from exc


def local_path(uri: str) -> Path:
    """The path a plain path or a file:// URI names."""
    parsed = urlparse(uri)
    return Path(unquote(parsed.path) if parsed.scheme else uri)


def _local(uri: str, policy: FetchPolicy) -> Path:
    """A plain path or a file:// URI, when the policy allows local files at all."""
    if not policy.allow_file:
        raise FetchError("artifact.fetch_failed", "file:// URIs are not enabled")
    return local_path(uri)


def fetch_artifact(
    uri: str, expected: str | None, store: ContentStore, policy: FetchPolicy,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Path:
    """A local path holding exactly the bytes of `uri` (and of `expected`, when given)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = _local(uri, policy)
        if not path.is_file():
            raise FetchError("artifact.unreadable", f"{path} is not a readable file")
        return path
    if (cached := store.cached(expected)) is not None:
        return cached
    if parsed.scheme == "https":
        return _fetch_https(uri, expected, store, policy, progress)
    if (match := HF_URI.match(uri)) is not None:
        return _fetch_hf(match, expected, store, policy)
    if parsed.scheme == "hf":
        raise FetchError("artifact.fetch_failed", "hf:// URIs need owner/repo@<40-hex commit>/path")
    raise FetchError("artifact.fetch_failed", f"unsupported URI scheme {parsed.scheme!r}")


def fetch_source(uri: str, store: ContentStore, policy: FetchPolicy) -> Path:
    """A local model directory: a path / file:// URI, or an hf:// repository snapshot at a pinned commit."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = _local(uri, policy)
        if not path.is_dir():
            raise FetchError("source.missing", f"{path} is not a directory")
        return path
    match = HF_URI.match(uri)
    if match is None or match["path"]:
        raise FetchError("artifact.fetch_failed", "a source URI is a directory or hf://owner/repo@<40-hex commit>")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:  # the hub cache's snapshot folder holds exactly the repository's files at that commit
        return Path(snapshot_download(match["repo"], revision=match["rev"], cache_dir=store.root / "hf",
                                      endpoint=policy.hf_endpoint))
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise FetchError("artifact.fetch_failed", f"{uri}: {exc}") from exc
