"""Which URIs may be fetched: the one policy, applied at submission and by the transport on every
request and redirect hop. `https://` only (plus the operator's own hub endpoint), hosts compared
case-insensitively without a trailing dot, cloud metadata hosts always refused, addresses public
after unwrapping IPv4-in-IPv6 (`edge.addresses`); `hf://` must pin a commit and hold no dot segment
(`hf_parts`); `file://` only inside
the configured roots (`edge.file_roots`). A URI holding a NUL byte (raw or `%00`), a lone surrogate,
a control character or whitespace is refused before it is parsed. Every refusal is a UriRefusedError,
whatever the input (the service turns it into a 422); messages never quote a URI's secrets."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

from edge.addresses import IPAddress, refusal
from edge.file_roots import OutsideRootsError, file_uri_path, inside
from edge.redact import redact, redact_uri
from engine.errors import ConvgateError

HF_URI = re.compile(r"^hf://(?P<repo>[\w.-]+/[\w.-]+)@(?P<rev>[0-9a-f]{40})(?:/(?P<path>.+))?$")
UNSAFE_TEXT = re.compile(r"[\x00-\x20\x7f-\x9f\s]|%00")
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data", "metadata.azure.internal"})

Resolver = Callable[[str], list[IPAddress]]


class UriRefusedError(ConvgateError, ValueError):
    """The URI is outside the configured policy (a definitive answer: never retried)."""

    code = "uri.refused"


def _dot_segment(segment: str) -> bool:
    """`.` or `..`, as written or percent-encoded at any depth (`%2e%2e`, `.%2E`, `%252e.`)."""
    while segment not in (".", ".."):
        decoded = unquote(segment)  # one level; each decoding that changes the text shortens it
        if decoded == segment:
            return False
        segment = decoded
    return True


def hf_parts(uri: str) -> tuple[str, str, str | None]:
    """(repository, commit, path or None) of an `hf://owner/repo@<commit>[/path]` URI, else UriRefusedError.
    No segment of the repository or the path may be `.` or `..`, raw or percent-encoded: the hub's URL is
    built from them, and once normalised `../../evil/repo/resolve/main/x` leaves the pinned repository and
    commit for another repository's mutable branch."""
    match = HF_URI.match(uri)
    if match is None:
        raise UriRefusedError("hf:// URIs must pin a 40-hex commit: hf://owner/repo@<commit>[/path]")
    segments = match["repo"].split("/") + (match["path"].split("/") if match["path"] else [])
    if any(_dot_segment(segment) for segment in segments):
        raise UriRefusedError("hf:// URIs may not hold a dot segment ('.' or '..', raw or percent-encoded)")
    return match["repo"], match["rev"], match["path"]


def split(uri: str) -> SplitResult:
    """`uri`'s parts, or UriRefusedError for text no URI holds (urlsplit itself raises a bare ValueError
    for a malformed IPv6 host)."""
    if UNSAFE_TEXT.search(uri):
        raise UriRefusedError("a URI may not hold whitespace, control characters or %00")
    try:
        uri.encode("utf-8")
        return urlsplit(uri)
    except ValueError as exc:  # UnicodeEncodeError (a lone surrogate) included
        raise UriRefusedError("not a valid URI") from exc


def normal_host(host: str) -> str:
    """Hosts compare case-insensitively and without the root's trailing dot."""
    return host.strip("[]").lower().rstrip(".")


def system_resolver(host: str) -> list[IPAddress]:
    """Every address `host` resolves to (a literal address is itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, ValueError) as exc:  # UnicodeError (IDNA) is a ValueError
        raise UriRefusedError(f"host {host!r} does not resolve") from exc
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


@dataclass(frozen=True, kw_only=True)
class UriPolicy:
    allow_file: bool = False
    file_roots: tuple[Path, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    allow_private_addresses: bool = False
    trusted_hosts: tuple[str, ...] = ()
    resolver: Resolver = system_resolver

    def check(self, uri: str, *, directory: bool = False) -> None:
        """Refuse a submitted URI that the worker would refuse (without touching the files)."""
        scheme = split(uri).scheme
        if scheme == "file":
            self.local_path(uri, must_exist=False)
        elif scheme == "hf":
            if hf_parts(uri)[2] and directory:
                raise UriRefusedError("hf:// URIs must pin a 40-hex commit: hf://owner/repo@<commit>[/path]")
        elif scheme != "https" or directory:
            raise UriRefusedError(f"scheme {scheme or '(none)'!r} is not allowed here")
        else:
            self.addresses(self.check_url(uri))

    def local_path(self, uri: str, *, must_exist: bool = True) -> Path:
        """The resolved local path of a `file://` URI (or plain path) inside an allowed root."""
        if not self.allow_file:
            raise UriRefusedError("file:// URIs are disabled on this server")
        if not self.file_roots:
            raise UriRefusedError("file:// URIs are refused: no file roots are configured (file_roots)")
        try:
            given = file_uri_path(uri)
            path = inside(given, self.file_roots)
        except OutsideRootsError as exc:
            raise UriRefusedError(redact(str(exc))) from exc
        if must_exist and not path.exists():
            raise UriRefusedError(f"{redact(str(given))} does not exist")  # not where a symlink leads
        return path

    def check_url(self, url: str, *, allowed_origins: frozenset[str] = frozenset()) -> str:
        """The normalised host of an `https://` URL (or of one of `allowed_origins`) the policy admits."""
        parts = split(url)
        host = normal_host(parts.hostname or "")
        origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}".lower()
        if parts.scheme != "https" and origin not in allowed_origins:
            raise UriRefusedError(f"refusing {parts.scheme!r} URL {redact_uri(url)} (only https)")
        if not host:
            raise UriRefusedError(f"{redact_uri(url)} names no host")
        if host in METADATA_HOSTS:
            raise UriRefusedError(f"host {host!r} is a cloud metadata service")
        if self.allowed_hosts is not None and host not in {normal_host(h) for h in self.allowed_hosts}:
            raise UriRefusedError(f"host {host!r} is not in the allowed hosts")
        return host

    def addresses(self, host: str) -> list[IPAddress]:
        """Resolve `host` once and return its addresses when every one may be connected to."""
        try:  # a literal address is itself: no resolver is asked
            addresses: list[IPAddress] = [ipaddress.ip_address(host)]
        except ValueError:
            addresses = self.resolver(host)
        if not addresses:
            raise UriRefusedError(f"host {host!r} does not resolve")
        exempt = self.allow_private_addresses or normal_host(host) in {normal_host(h) for h in self.trusted_hosts}
        for address in addresses:
            if (why := refusal(address, allow_private=exempt)) is not None:
                raise UriRefusedError(f"host {host!r}: {why}")
        return addresses
