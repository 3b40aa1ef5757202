"""The one transport every fetch goes through: an httpx transport whose connections are opened by a
network backend that resolves the host once, checks every address with the `UriPolicy`, and connects
to an address it checked. TLS still verifies the certificate against the URL's host name (SNI and
`Host` are the name, the socket goes to the checked IP), so a DNS answer that changes between the
check and the connection (rebinding) cannot redirect the connection. Each request, and so each
redirect hop the caller follows, is checked before it is sent.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator

import httpcore
import httpx

from edge.deadline import DeadlineStream, remaining
from edge.uri_policy import UriPolicy, normal_host

# httpcore's errors as httpx's, most specific first: one table, tested to leave none unmapped
ERROR_MAP: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for source, target in ERROR_MAP:
            if isinstance(exc, source):
                raise target(str(exc)) from exc
        raise


class CheckedBackend(httpcore.SyncBackend):
    """Opens TCP connections only to addresses the policy admitted for the host, resolved once; each
    connection, and every operation on it, keeps to the caller's total deadline if it set one
    (`edge.deadline`)."""

    def __init__(self, policy: UriPolicy) -> None:
        self.policy = policy

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
        error: httpcore.ConnectError | None = None
        for address in self.policy.addresses(normal_host(host)):
            try:
                return DeadlineStream(super().connect_tcp(str(address), port,
                                                          remaining(timeout, httpcore.ConnectTimeout),
                                                          local_address, socket_options))
            except httpcore.ConnectError as exc:  # try the next checked address, as getaddrinfo callers do
                error = exc
        assert error is not None  # addresses() never returns an empty list
        raise error


class _Body(httpx.SyncByteStream):
    def __init__(self, stream: Iterable[bytes]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _mapped_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


class PolicyTransport(httpx.BaseTransport):
    """httpx transport enforcing `policy` on every request; `allowed_origins` may use plain http
    (the operator's own hub endpoint, e.g. an internal mirror)."""

    def __init__(self, policy: UriPolicy, *, verify: bool | ssl.SSLContext = True,
                 allowed_origins: frozenset[str] = frozenset()) -> None:
        self.policy = policy
        self.allowed_origins = allowed_origins
        context = verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify=verify)
        self._pool = httpcore.ConnectionPool(ssl_context=context, network_backend=CheckedBackend(policy))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.policy.check_url(str(request.url), allowed_origins=self.allowed_origins)
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        with _mapped_errors():
            response = self._pool.handle_request(core)
        assert isinstance(response.stream, Iterable)
        return httpx.Response(status_code=response.status, headers=response.headers, stream=_Body(response.stream),
                              extensions=response.extensions)

    def close(self) -> None:
        self._pool.close()


def checked_client(policy: UriPolicy, *, verify: bool | ssl.SSLContext, timeout_s: float,
                   allowed_origins: frozenset[str] = frozenset()) -> httpx.Client:
    """An httpx client on the policy transport; redirects are left to the caller (each hop re-checked)."""
    transport = PolicyTransport(policy, verify=verify, allowed_origins=allowed_origins)
    return httpx.Client(transport=transport, follow_redirects=False, timeout=timeout_s, trust_env=False)
