"""One HTTP download through the policy transport: redirects followed by hand (each hop checked by
the transport), a size limit, the digest computed while streaming, and every failure classified as
definitive (`FetchError`: a NO-GO blocker) or transient (retried, then no verdict)."""

from __future__ import annotations

import hashlib
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx

from edge.errors import FetchError
from edge.redact import redact_uri
from edge.retry import RetryLaterError, RetryPolicy, parse_retry_after
from edge.transport import checked_client
from edge.uri_policy import UriPolicy, UriRefusedError
from engine.digests import CHUNK_BYTES

MAX_REDIRECTS = 5
RETRY_STATUSES = frozenset({408, 425, 429})  # and every 5xx


@dataclass(frozen=True, kw_only=True)
class FetchPolicy:
    """What may be fetched (`uris`) and how: limits, TLS trust, the hub endpoint, retries."""

    uris: UriPolicy = field(default_factory=UriPolicy)
    max_bytes: int = 200 * 2**30
    timeout_s: float = 60.0
    verify: bool | ssl.SSLContext = True
    hf_endpoint: str | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    headers_for: Callable[[str], dict[str, str]] = field(default=lambda url: {}, compare=False)

    def client(self) -> httpx.Client:
        origins: frozenset[str] = frozenset()
        if self.hf_endpoint is not None:
            parts = urlsplit(self.hf_endpoint)
            origins = frozenset({f"{parts.scheme}://{parts.netloc}".lower()})
        return checked_client(self.uris, verify=self.verify, timeout_s=self.timeout_s, allowed_origins=origins)


def _has_certificate_error(exc: BaseException | None) -> bool:
    while exc is not None:
        if isinstance(exc, ssl.SSLCertVerificationError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def classify(url: str, response: httpx.Response) -> None:
    """Raise for a status that is not a success: transient (retried) or definitive (a blocker)."""
    status = response.status_code
    if status < 400:
        return
    why = f"{redact_uri(url)}: HTTP {status} {response.reason_phrase}"
    if status in RETRY_STATUSES or status >= 500:
        raise RetryLaterError(why, parse_retry_after(response.headers.get("retry-after")))
    raise FetchError("artifact.fetch_failed", why)


def _stream_once(url: str, temp: Path, policy: FetchPolicy, progress: Callable[[int, int], None]) -> str:
    """Download `url` (following redirects) into `temp`; the sha256 of what was written."""
    with policy.client() as client:
        for _ in range(MAX_REDIRECTS + 1):
            with client.stream("GET", url, headers=policy.headers_for(url)) as response:
                if response.is_redirect:
                    url = urljoin(url, response.headers["location"])
                    continue
                classify(url, response)
                return _write(url, response, temp, policy.max_bytes, progress)
    raise FetchError("artifact.fetch_failed", f"more than {MAX_REDIRECTS} redirects")


def _write(url: str, response: httpx.Response, temp: Path, limit: int,
           progress: Callable[[int, int], None]) -> str:
    total = int(response.headers.get("content-length") or 0)
    if total > limit:
        raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: {total} bytes exceed the {limit} limit")
    digest, done = hashlib.sha256(), 0
    with temp.open("wb") as out:
        for chunk in response.iter_bytes(CHUNK_BYTES):
            done += len(chunk)
            if done > limit:
                raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: more than {limit} bytes")
            digest.update(chunk)
            out.write(chunk)
            progress(done, total)
    return digest.hexdigest()


def _attempt(url: str, temp: Path, policy: FetchPolicy, progress: Callable[[int, int], None]) -> str:
    try:
        return _stream_once(url, temp, policy, progress)
    except UriRefusedError as exc:
        raise FetchError("artifact.fetch_failed", f"refused: {exc}") from exc
    except httpx.TransportError as exc:
        if _has_certificate_error(exc):
            raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: certificate refused: {exc}") from exc
        raise RetryLaterError(f"{redact_uri(url)}: {type(exc).__name__}: {exc}") from exc
    except httpx.HTTPError as exc:
        raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: {type(exc).__name__}: {exc}") from exc
    except (httpx.InvalidURL, ValueError) as exc:  # its message quotes a piece of the URL (a port, a host)
        raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: not a URL ({type(exc).__name__})") from None


def download(url: str, temp: Path, policy: FetchPolicy, progress: Callable[[int, int], None]) -> str:
    """`url` into `temp`, transient failures retried with bounded backoff; the sha256 of its bytes.
    `temp` is removed when the download fails for good."""
    try:
        return policy.retry.run(lambda: _attempt(url, temp, policy, progress))
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def get_json(url: str, policy: FetchPolicy, *, form: dict[str, list[str]] | None = None) -> object:
    """A small JSON document (a hub API answer) through the same transport, retries and checks."""

    def once() -> object:
        try:
            with policy.client() as client:
                response = client.request("POST" if form is not None else "GET", url, data=form,
                                          headers=policy.headers_for(url))
                classify(url, response)
                return response.json()
        except UriRefusedError as exc:
            raise FetchError("artifact.fetch_failed", f"refused: {exc}") from exc
        except httpx.TransportError as exc:
            raise RetryLaterError(f"{redact_uri(url)}: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:
            raise FetchError("artifact.fetch_failed", f"{redact_uri(url)}: not JSON: {exc}") from exc

    return policy.retry.run(once)
