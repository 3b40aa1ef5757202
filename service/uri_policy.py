"""Which URIs a submission may name. Artifacts come from pipelines and the internet, so `https://`
must not reach this cluster's own network: loopback, link-local (incl. the cloud metadata service),
private and otherwise non-global addresses are refused, at submission and on every redirect hop
(the worker re-checks with `check_url`). `file://` only when the operator enables it."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from worker.fetch import HF_URI, FetchError

METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data"})


class UriRefusedError(ValueError):
    """The URI is outside the configured policy."""


@dataclass(frozen=True, kw_only=True)
class UriPolicy:
    allow_file: bool
    allowed_hosts: tuple[str, ...] | None = None
    allow_private_addresses: bool = False
    trusted_hosts: tuple[str, ...] = ()

    def check(self, uri: str, *, directory: bool = False) -> None:
        parsed = urlparse(uri)
        if parsed.scheme == "file":
            if not self.allow_file:
                raise UriRefusedError("file:// URIs are disabled on this server")
            return
        if parsed.scheme == "hf":
            match = HF_URI.match(uri)
            if match is None or (directory and match["path"]):
                raise UriRefusedError("hf:// URIs must pin a 40-hex commit: hf://owner/repo@<commit>[/path]")
            return
        if parsed.scheme != "https" or directory:
            raise UriRefusedError(f"scheme {parsed.scheme or '(none)'!r} is not allowed here")
        self.check_https(uri)

    def check_https(self, url: str) -> None:
        host = urlparse(url).hostname or ""
        if self.allowed_hosts is not None and host not in self.allowed_hosts:
            raise UriRefusedError(f"host {host!r} is not in the allowed hosts")
        if self.allow_private_addresses or host in self.trusted_hosts:
            return
        if host.lower() in METADATA_HOSTS:
            raise UriRefusedError(f"host {host!r} is a metadata service")
        for address in resolve(host):
            if not address.is_global or address.is_multicast:
                raise UriRefusedError(f"host {host!r} resolves to non-public address {address}")

    def fetch_hook(self, url: str) -> None:
        """For `FetchPolicy.check_url`: refuse a redirect hop the same way as a submitted URI."""
        try:
            self.check_https(url)
        except UriRefusedError as exc:
            raise FetchError("artifact.fetch_failed", f"redirect refused: {exc}") from exc


def resolve(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise UriRefusedError(f"host {host!r} does not resolve") from exc
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
