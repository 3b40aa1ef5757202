"""`hf://owner/repo@<40-hex commit>[/path]` over the Hugging Face hub's HTTP API, through the same
policy transport as every other download (so the hub's CDN redirects are checked hop by hop): a file
by `resolve/<commit>/<path>` with the LFS sha256 the hub reports compared, a source snapshot by the
commit's file list. A token (`HF_TOKEN`) is sent to the hub endpoint only, never to a redirect target.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote, urlsplit

from edge.download import FetchPolicy, download, get_json
from edge.errors import FetchError
from edge.file_roots import is_plain_relative
from edge.store import ContentStore

DEFAULT_ENDPOINT = "https://huggingface.co"
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _mismatch(actual: str, expected: str) -> FetchError:
    return FetchError("artifact.sha256_mismatch", f"sha256 is {actual}, expected {expected}; the file is not used")


def _with_token(policy: FetchPolicy, endpoint: str) -> FetchPolicy:
    token = os.environ.get("HF_TOKEN")
    if not token:
        return policy
    origin = urlsplit(endpoint)[:2]
    return dataclasses.replace(
        policy, headers_for=lambda url: {"authorization": f"Bearer {token}"} if urlsplit(url)[:2] == origin else {})


@dataclasses.dataclass(frozen=True)
class Hub:
    """One repository at one commit on the hub endpoint of `policy`."""

    repo: str
    revision: str
    policy: FetchPolicy

    @property
    def endpoint(self) -> str:
        return (self.policy.hf_endpoint or DEFAULT_ENDPOINT).rstrip("/")

    def _policy(self) -> FetchPolicy:
        return _with_token(self.policy, self.endpoint)

    def file_url(self, path: str) -> str:
        return f"{self.endpoint}/{self.repo}/resolve/{self.revision}/{quote(path)}"

    def lfs_sha256(self, path: str) -> str | None:
        """The sha256 the hub records for an LFS file (None for a plain git file)."""
        url = f"{self.endpoint}/api/models/{self.repo}/paths-info/{self.revision}"
        infos = get_json(url, self._policy(), form={"paths": [path]})
        for info in infos if isinstance(infos, list) else []:
            lfs = info.get("lfs") if isinstance(info, dict) and info.get("path") == path else None
            if isinstance(lfs, dict) and isinstance(lfs.get("oid"), str) and SHA256.match(lfs["oid"]):
                return str(lfs["oid"])
        return None

    def files(self) -> list[str]:
        """The repository's file names at the commit, each a plain relative path."""
        info = get_json(f"{self.endpoint}/api/models/{self.repo}/revision/{self.revision}", self._policy())
        siblings = info.get("siblings") if isinstance(info, dict) else None
        if not isinstance(siblings, list):
            raise FetchError("artifact.fetch_failed", f"hf://{self.repo}@{self.revision}: the hub listed no files")
        names = [s.get("rfilename") for s in siblings if isinstance(s, dict)]
        unsafe = [repr(n) for n in names if not isinstance(n, str) or not is_plain_relative(n)]
        if unsafe:
            raise FetchError("artifact.fetch_failed", f"the hub listed unsafe file names: {', '.join(unsafe)}")
        return [str(n) for n in names]

    def download_to(self, path: str, temp: Path, progress: Callable[[int, int], None]) -> str:
        return download(self.file_url(path), temp, self._policy(), progress)


def fetch_hf_file(hub: Hub, path: str, expected: str | None, store: ContentStore,
                  progress: Callable[[int, int], None]) -> Path:
    lfs_sha = hub.lfs_sha256(path)
    temp = store.temp_file()
    actual = hub.download_to(path, temp, progress)
    for wanted, label in ((lfs_sha, " (the hub's LFS digest)"), (expected and expected.lower(), "")):
        if wanted is not None and actual != wanted:
            temp.unlink(missing_ok=True)
            raise _mismatch(actual, f"{wanted}{label}")
    return store.admit(temp, actual)


def fetch_hf_snapshot(hub: Hub, store: ContentStore) -> Path:
    """Every file of the repository at the commit, under `store.root/hf/<owner>--<name>/<commit>`, and
    nothing else: the report lists every file there as the source's, so the marker that says the snapshot
    is whole sits beside it."""
    target = store.root / "hf" / hub.repo.replace("/", "--") / hub.revision
    complete = target.with_name(target.name + ".complete")
    if complete.is_file() and target.is_dir():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    for name in hub.files():
        destination = partial / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        hub.download_to(name, destination, lambda done, total: None)
    partial.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    complete.write_text(hub.revision + "\n", encoding="utf-8")
    return target
