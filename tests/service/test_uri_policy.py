"""Submitted URIs pass one policy: https only to public addresses (loopback, link-local incl. the
metadata service, private ranges refused, after unwrapping every IPv4-in-IPv6 form), also on every
redirect hop; hosts compared case-insensitively; file:// only inside the configured roots."""

from __future__ import annotations

import ipaddress
import os
import ssl
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import httpcore
import httpx
import pytest
import trustme
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.addresses import embedded, refusal
from edge.deadline import DeadlineStream
from edge.download import FetchPolicy
from edge.errors import FetchError
from edge.fetch import fetch_artifact, fetch_source
from edge.file_roots import check_tree, file_uri_path, is_plain_relative
from edge.retry import RetryPolicy
from edge.store import ContentStore
from edge.transport import ERROR_MAP
from edge.uri_policy import UriPolicy, UriRefusedError, normal_host, system_resolver
from tests.integration.test_fetch import ROUTES, serve

PUBLIC_ONLY = UriPolicy(allow_file=False)


def fixed(*answers: str):
    """A resolver that answers every host with `answers` (no DNS in these tests)."""
    return lambda host: [ipaddress.ip_address(a) for a in answers]


@pytest.mark.parametrize(
    "uri",
    ["https://127.0.0.1/x.gguf", "https://[::1]/x.gguf", "https://169.254.169.254/latest/meta-data",
     "https://metadata.google.internal/computeMetadata/v1/", "https://10.0.0.8/x.gguf", "https://192.168.1.2/x",
     "https://172.16.5.4/x", "https://[fe80::1]/x", "https://0.0.0.0/x", "https://localhost/x.gguf",
     "http://8.8.8.8/x.gguf", "file:///etc/passwd", "ftp://8.8.8.8/x", "https://100.64.0.1/x",
     "https://224.0.0.1/x", "https:///x"],
)
def test_refused_uris(uri):
    with pytest.raises(UriRefusedError):
        PUBLIC_ONLY.check(uri)


@pytest.mark.parametrize(("address", "carried"), [
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),  # NAT64 well-known prefix
    ("64:ff9b::a00:1", "10.0.0.1"),
    ("64:ff9b:1::a9fe:a9fe", None),  # local-use NAT64: refused whatever it carries
    ("2002:a9fe:a9fe::1", "169.254.169.254"),  # 6to4
    ("2002:7f00:1::1", "127.0.0.1"),
    ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1"),  # Teredo, client 10.0.0.1 (obfuscated)
    ("::ffff:a9fe:a9fe", "169.254.169.254"),  # IPv4-mapped
    ("::ffff:0:a00:1", "10.0.0.1"),  # IPv4-translated
    ("::a9fe:a9fe", "169.254.169.254"),  # IPv4-compatible
    ("::c0a8:102", "192.168.1.2"),
])
def test_ipv4_carried_in_ipv6_is_unwrapped_before_the_public_check(address, carried):
    ip = ipaddress.ip_address(address)
    if carried is not None:
        assert ipaddress.ip_address(carried) in embedded(ip)
    assert refusal(ip, allow_private=False) is not None
    with pytest.raises(UriRefusedError, match=r"not a public|metadata|NAT64"):
        PUBLIC_ONLY.check(f"https://[{address}]/x.gguf")
    with pytest.raises(UriRefusedError):
        UriPolicy(resolver=fixed(address)).check("https://models.example/x.gguf")


def test_public_addresses_in_every_form_pass():
    for address in ("8.8.8.8", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::1", "::ffff:808:808"):
        assert refusal(ipaddress.ip_address(address), allow_private=False) is None, address
    assert embedded(ipaddress.ip_address("8.8.8.8")) == [ipaddress.ip_address("8.8.8.8")]
    assert embedded(ipaddress.ip_address("::1")) == [ipaddress.ip_address("::1")]
    assert embedded(ipaddress.ip_address("::")) == [ipaddress.ip_address("::")]


def test_public_literal_addresses_and_pinned_hf_uris_pass():
    PUBLIC_ONLY.check("https://8.8.8.8/model.gguf")
    PUBLIC_ONLY.check("hf://org/model@0123456789abcdef0123456789abcdef01234567/model.gguf")
    PUBLIC_ONLY.check("hf://org/model@0123456789abcdef0123456789abcdef01234567", directory=True)
    for refused in ("hf://org/model@main/model.gguf",
                    "hf://org/model@0123456789abcdef0123456789abcdef01234567/x.gguf"):
        with pytest.raises(UriRefusedError, match="40-hex"):
            PUBLIC_ONLY.check(refused, directory=True)
    with pytest.raises(UriRefusedError, match="scheme 'https' is not allowed"):
        PUBLIC_ONLY.check("https://8.8.8.8/model", directory=True)


REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("uri", [
    f"hf://org/repo@{REV}/../../../../evil/repo/resolve/main/x.gguf",
    f"hf://org/repo@{REV}/dir/../x.gguf", f"hf://org/repo@{REV}/./x.gguf", f"hf://org/repo@{REV}/x/..",
    f"hf://org/repo@{REV}/%2e%2e/%2E%2E/evil/x.gguf", f"hf://org/repo@{REV}/.%2e/x.gguf",
    f"hf://org/repo@{REV}/%252e%252e/x.gguf", f"hf://../..@{REV}/x.gguf", f"hf://org/..@{REV}/x.gguf",
    f"hf://org/.@{REV}",
])
def test_dot_segments_in_an_hf_uri_are_refused(uri, tmp_path):
    """Issue 34: `..` (raw or percent-encoded, at any depth) left the pinned repository and commit once the
    hub's URL was normalised, and fetched another repository's mutable branch; refused at submission and
    again in the worker, before any request."""
    with pytest.raises(UriRefusedError, match="dot segment"):
        PUBLIC_ONLY.check(uri, directory="/" not in uri.split("@", 1)[1])
    with pytest.raises(FetchError, match="dot segment"):
        fetch_artifact(uri, "e" * 64, ContentStore(tmp_path), FetchPolicy(uris=PUBLIC_ONLY))


def test_dots_inside_hf_names_are_kept():
    for uri in (f"hf://org.name/repo.v2@{REV}/model..Q4.gguf", f"hf://org/repo@{REV}/.cache-free/...x.gguf",
                f"hf://org/repo@{REV}/%2e%2e%2e/x.gguf", f"hf://org/repo@{REV}/%252e%252e%252e/x.gguf"):
        PUBLIC_ONLY.check(uri)


@pytest.mark.parametrize("depth", [1, 2, 8, 9, 12])
def test_a_dot_segment_is_refused_however_deep_its_encoding(depth):
    """Each level of `%25` is one more decoding by some client on the way; none stops being a dot segment."""
    encoded = "%" + "25" * (depth - 1) + "2e"
    for segment in (encoded * 2, "." + encoded, encoded):
        with pytest.raises(UriRefusedError, match="dot segment"):
            PUBLIC_ONLY.check(f"hf://org/repo@{REV}/a/{segment}/x.gguf")


def test_a_host_resolving_to_any_private_address_is_refused():
    with pytest.raises(UriRefusedError, match=r"'models\.example'.*10\.0\.0\.1"):
        UriPolicy(resolver=fixed("8.8.8.8", "10.0.0.1")).check("https://models.example/x")
    with pytest.raises(UriRefusedError, match="does not resolve"):
        UriPolicy(resolver=fixed()).check("https://models.example/x")
    assert UriPolicy(resolver=fixed("8.8.8.8")).addresses("models.example") == [ipaddress.ip_address("8.8.8.8")]


def test_allowed_hosts_compare_case_insensitively_and_without_trailing_dot():
    policy = UriPolicy(allowed_hosts=("Models.Example.COM.",), resolver=fixed("8.8.8.8"))
    for uri in ("https://models.example.com/m.gguf", "https://MODELS.example.com./m.gguf"):
        policy.check(uri)
    with pytest.raises(UriRefusedError, match="allowed hosts"):
        policy.check("https://other.example.com/m.gguf")
    assert normal_host("[::1]") == "::1" and normal_host("A.B.") == "a.b"


def test_trusted_hosts_skip_the_address_check_case_insensitively():
    policy = UriPolicy(trusted_hosts=("Mirror.Internal",), resolver=fixed("10.0.0.5"))
    assert policy.addresses("mirror.internal.") == [ipaddress.ip_address("10.0.0.5")]
    with pytest.raises(UriRefusedError, match="not a public"):
        policy.addresses("other.internal")


@pytest.mark.parametrize("uri", ["https://metadata.google.internal/computeMetadata/v1/",
                                 "https://METADATA.google.internal./x", "https://instance-data/latest",
                                 "https://169.254.169.254/latest/meta-data", "https://[fd00:ec2::254]/x",
                                 "https://[64:ff9b::a9fe:a9fe]/x"])
def test_metadata_services_are_refused_even_where_private_addresses_are_allowed(uri):
    # resolving the metadata names to a public address shows the refusal is by name, not by address
    for policy in (UriPolicy(allow_private_addresses=True, resolver=fixed("8.8.8.8")),
                   UriPolicy(trusted_hosts=("metadata.google.internal", "169.254.169.254"),
                             resolver=fixed("8.8.8.8"))):
        with pytest.raises(UriRefusedError, match="metadata"):
            policy.check(uri)


def test_private_addresses_pass_when_allowed_for_testing():
    UriPolicy(allow_private_addresses=True).check("https://127.0.0.1/x.gguf")
    UriPolicy(allow_private_addresses=True).check("https://[::1]/x.gguf")


def test_system_resolver_answers_literals_without_dns_and_refuses_unknown_names():
    assert system_resolver("127.0.0.1") == [ipaddress.ip_address("127.0.0.1")]
    assert ipaddress.ip_address("127.0.0.1") in system_resolver("localhost")
    with pytest.raises(UriRefusedError, match="does not resolve"):
        system_resolver("no-such-host.invalid")


# --- file roots ---------------------------------------------------------------------------------

@pytest.fixture
def roots(tmp_path) -> tuple[Path, Path]:
    """An allowed root with a model in it, and a directory outside every root."""
    root, outside = tmp_path / "models", tmp_path / "private"
    (root / "m").mkdir(parents=True)
    (root / "m" / "config.json").write_text("{}")
    (root / "m.gguf").write_bytes(b"GGUF")
    outside.mkdir()
    (outside / "secret.gguf").write_bytes(b"GGUF")
    return root, outside


def rooted(root: Path) -> UriPolicy:
    return UriPolicy(allow_file=True, file_roots=(root,))


def test_file_uris_inside_a_root_pass(roots):
    root, _ = roots
    assert rooted(root).local_path((root / "m.gguf").as_uri()) == (root / "m.gguf").resolve()
    rooted(root).check((root / "m").as_uri(), directory=True)
    rooted(root).check((root / "not-yet.gguf").as_uri())  # submission: the worker checks existence
    with pytest.raises(UriRefusedError, match="does not exist"):
        rooted(root).local_path((root / "not-yet.gguf").as_uri())


def test_file_uris_outside_the_roots_are_refused(roots):
    root, outside = roots
    (root / "link.gguf").symlink_to(outside / "secret.gguf")
    (root / "linked-dir").symlink_to(outside)
    for uri in ((outside / "secret.gguf").as_uri(), f"{root.as_uri()}/../private/secret.gguf",
                f"{root.as_uri()}/%2e%2e/private/secret.gguf", (root / "link.gguf").as_uri(),
                (root / "linked-dir" / "secret.gguf").as_uri(), "file:///etc/passwd",
                f"file://otherhost{root}/m.gguf"):
        with pytest.raises(UriRefusedError, match=r"outside the allowed file roots|not host"):
            rooted(root).check(uri)


def test_file_uris_need_the_switch_and_a_root(roots):
    root, _ = roots
    with pytest.raises(UriRefusedError, match="disabled"):
        UriPolicy(allow_file=False, file_roots=(root,)).check((root / "m.gguf").as_uri())
    with pytest.raises(UriRefusedError, match="no file roots are configured"):
        UriPolicy(allow_file=True).check((root / "m.gguf").as_uri())


def test_a_root_that_is_itself_a_symlink_is_resolved(roots, tmp_path):
    root, _ = roots
    alias = tmp_path / "alias"
    alias.symlink_to(root)
    assert rooted(alias).local_path((root / "m.gguf").as_uri()) == (root / "m.gguf").resolve()


def test_a_source_directory_with_a_symlink_leaving_the_root_is_refused(roots, tmp_path):
    root, outside = roots
    policy = FetchPolicy(uris=rooted(root))
    store = ContentStore(tmp_path / "cache")
    assert fetch_source((root / "m").as_uri(), store, policy) == (root / "m").resolve()
    (root / "m" / "model.safetensors").symlink_to(outside / "secret.gguf")
    with pytest.raises(FetchError, match="leaves the roots"):
        fetch_source((root / "m").as_uri(), store, policy)
    (root / "m" / "model.safetensors").unlink()
    (root / "m" / "1_Pooling").symlink_to(outside, target_is_directory=True)
    with pytest.raises(FetchError, match="leaves the roots"):
        fetch_source((root / "m").as_uri(), store, policy)
    with pytest.raises(FetchError, match="not a directory") as info:
        fetch_source((root / "m.gguf").as_uri(), store, policy)
    assert info.value.code == "source.missing"


def test_tree_and_name_helpers(roots):
    root, _ = roots
    check_tree(root, (root,))
    os.symlink("../private", root / "escape")
    with pytest.raises(ValueError, match="outside"):
        check_tree(root, (root,))
    assert file_uri_path("relative/m.gguf") == Path("relative/m.gguf")
    assert file_uri_path("file://localhost/a%20b") == Path("/a b")
    with pytest.raises(ValueError, match="not a local file URI"):
        file_uri_path("https://h/x")
    assert is_plain_relative("a/b.json") and is_plain_relative("1_Pooling/config.json")
    for name in ("", "/etc/passwd", "../x", "a/../../b", "a\\..\\b"):
        assert not is_plain_relative(name), name


# --- the transport ------------------------------------------------------------------------------

def test_every_httpcore_error_is_mapped():
    # ConnectionNotAvailable is the pool's internal "try another connection" signal, handled inside it
    errors = [value for value in vars(httpcore).values()
              if isinstance(value, type) and issubclass(value, Exception) and value.__module__.startswith("httpcore")
              and value is not httpcore.ConnectionNotAvailable]
    mapped = [source for source, _ in ERROR_MAP]
    assert errors and all(any(issubclass(error, source) for source in mapped) for error in errors)
    for position, (source, target) in enumerate(ERROR_MAP):  # most specific first, mapped to its httpx twin
        assert target.__name__ == source.__name__ and issubclass(target, httpx.TransportError)
        assert not any(issubclass(source, earlier) for earlier, _ in ERROR_MAP[:position])


@pytest.fixture(scope="module")
def tls() -> Iterator[tuple[int, ssl.SSLContext]]:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    for _, port in serve(server_context):
        yield port, client_context


@pytest.mark.parametrize(
    "target", ["https://169.254.169.254/latest/meta-data/iam", "https://10.1.2.3/m.gguf", "https://localhost:{port}/m",
               "https://[64:ff9b::a9fe:a9fe]/latest/meta-data", "https://[::ffff:10.0.0.1]/m"]
)
def test_redirect_to_a_forbidden_address_is_refused_before_connecting(tls, tmp_path, target):
    port, client = tls
    ROUTES["/hop"] = (302, {"Location": target}, b"")
    # the mirror itself is trusted (an internal host the operator named); where it redirects is not
    policy = UriPolicy(trusted_hosts=("127.0.0.1",))
    fetch = FetchPolicy(uris=policy, verify=client, timeout_s=5, retry=RetryPolicy(attempts=1))
    with pytest.raises(FetchError, match="refused") as info:
        fetch_artifact(f"https://127.0.0.1:{port}/hop", None, ContentStore(tmp_path), fetch)
    assert info.value.code == "artifact.fetch_failed"


def test_the_backend_tries_each_checked_address_in_turn_and_passes_the_timeout(monkeypatch):
    from edge.transport import CheckedBackend

    calls: list[tuple] = []

    def parent(self, host, port, timeout=None, local_address=None, socket_options=None):
        calls.append((host, port, timeout, local_address, socket_options))
        if host == "10.0.0.1":
            raise httpcore.ConnectError("refused")
        return "stream"

    monkeypatch.setattr(httpcore.SyncBackend, "connect_tcp", parent)
    backend = CheckedBackend(UriPolicy(allow_private_addresses=True, resolver=fixed("10.0.0.1", "10.0.0.2")))
    connected = backend.connect_tcp("Mirror.Example.", 443, 2.5, "0.0.0.0", [(1, 2, 3)])
    assert isinstance(connected, DeadlineStream) and connected.stream == "stream"  # timed by any deadline
    assert calls == [("10.0.0.1", 443, 2.5, "0.0.0.0", [(1, 2, 3)]), ("10.0.0.2", 443, 2.5, "0.0.0.0", [(1, 2, 3)])]
    only_bad = CheckedBackend(UriPolicy(allow_private_addresses=True, resolver=fixed("10.0.0.1")))
    with pytest.raises(httpcore.ConnectError, match="refused"):
        only_bad.connect_tcp("mirror.example", 443)
    with pytest.raises(UriRefusedError):
        CheckedBackend(UriPolicy(resolver=fixed("10.0.0.1"))).connect_tcp("mirror.example", 443)


def test_closing_a_response_closes_the_connection_stream():
    from edge.transport import _Body

    class Stream(list):
        closed = False

        def close(self) -> None:
            self.closed = True

    stream = Stream([b"a", b"b"])
    body = _Body(stream)
    assert list(body) == [b"a", b"b"]
    body.close()
    assert stream.closed
    _Body([b"x"]).close()  # a stream without close() is fine


def test_the_transport_verifies_certificates_by_default(tls):
    from edge.transport import PolicyTransport

    port, client = tls
    ROUTES["/plain"] = (200, {}, b"ok")
    policy = UriPolicy(allow_private_addresses=True)
    with httpx.Client(transport=PolicyTransport(policy)) as default, pytest.raises(httpx.ConnectError,
                                                                                   match="CERTIFICATE"):
        default.get(f"https://127.0.0.1:{port}/plain")
    with httpx.Client(transport=PolicyTransport(policy, verify=client)) as trusting:
        response = trusting.get(f"https://127.0.0.1:{port}/plain")
        assert (response.status_code, response.read()) == (200, b"ok")
    with httpx.Client(transport=PolicyTransport(UriPolicy(resolver=fixed("8.8.8.8")))) as refusing, \
            pytest.raises(UriRefusedError, match="only https"):
        refusing.get("http://8.8.8.8/x")


def test_host_normalisation_strips_only_brackets_and_the_root_dot():
    assert normal_host("Xbox.Example.") == "xbox.example" and normal_host("BOX.") == "box"
    assert normal_host("[FE80::1]") == "fe80::1"


def test_system_resolver_asks_for_tcp_and_drops_ipv6_scope_ids(monkeypatch):
    import socket

    asked: list[dict] = []

    def getaddrinfo(host, port, **kwargs):
        asked.append(kwargs)
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%eth0", 0, 0, 2)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    assert system_resolver("mirror.example") == [ipaddress.ip_address("fe80::1"), ipaddress.ip_address("10.0.0.1")]
    assert asked == [{"proto": socket.IPPROTO_TCP}]
    assert system_resolver("8.8.4.4") == [ipaddress.ip_address("8.8.4.4")] and len(asked) == 1  # no lookup


def test_refusal_messages_say_what_was_refused():
    pin = "hf:// URIs must pin a 40-hex commit: hf://owner/repo@<commit>[/path]"
    cases = [
        (lambda: PUBLIC_ONLY.check("x.gguf"), "scheme '(none)' is not allowed here"),
        (lambda: PUBLIC_ONLY.check("hf://org/m@main"), pin),
        (lambda: PUBLIC_ONLY.check(f"hf://org/m@{REV}/x.gguf", directory=True), pin),
        (lambda: PUBLIC_ONLY.check(f"hf://org/m@{REV}/../x.gguf"),
         "hf:// URIs may not hold a dot segment ('.' or '..', raw or percent-encoded)"),
        (lambda: UriPolicy(allow_file=False).check("file:///m"), "file:// URIs are disabled on this server"),
        (lambda: UriPolicy(allow_file=True).check("file:///m"), "file:// URIs are refused: no file roots are "
                                                                 "configured (file_roots)"),
        (lambda: PUBLIC_ONLY.check("https:///x"), "https:///x names no host"),
        (lambda: PUBLIC_ONLY.check("https://h.example/a b"),
         "a URI may not hold whitespace, control characters or %00"),
        (lambda: PUBLIC_ONLY.check("https://h.example/\ud800"), "not a valid URI"),
        (lambda: PUBLIC_ONLY.check_url("http://models.example/x?sig=s3cret"),
         "refusing 'http' URL http://models.example/x?sig=REDACTED (only https)"),
    ]
    for call, message in cases:  # the whole message: a reader is told exactly this, and nothing more
        with pytest.raises(UriRefusedError) as info:
            call()
        assert str(info.value) == message
    for call, part in [
        (lambda: PUBLIC_ONLY.check("https://[64:ff9b::a00:1]/x"), "64:ff9b::a00:1 (carrying 10.0.0.1) is not a public"),
        (lambda: PUBLIC_ONLY.check("https://10.0.0.1/x"), "host '10.0.0.1': 10.0.0.1 is not a public unicast address"),
    ]:
        with pytest.raises(UriRefusedError) as info:
            call()
        assert part in str(info.value)


def test_the_resolver_is_asked_for_the_host_itself():
    asked: list[str] = []

    def resolver(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        asked.append(host)
        return [ipaddress.ip_address("8.8.8.8")]

    UriPolicy(resolver=resolver).check("https://Models.Example./x.gguf")
    assert asked == ["models.example"]


def test_only_the_operators_own_origin_may_be_plain_http():
    policy = UriPolicy(resolver=fixed("8.8.8.8"))
    origins = frozenset({"http://mirror.example:8080"})
    assert policy.check_url("http://user@Mirror.Example:8080/x", allowed_origins=origins) == "mirror.example"
    assert policy.check_url("http://a@b@mirror.example:8080/x", allowed_origins=origins) == "mirror.example"
    for url in ("http://mirror.example/x", "http://other.example:8080/x", "http://mirror.example:8080@evil/x"):
        with pytest.raises(UriRefusedError, match="only https"):
            policy.check_url(url, allowed_origins=origins)


def test_the_smallest_ipv4_compatible_addresses():
    assert ipaddress.ip_address("0.0.0.2") in embedded(ipaddress.ip_address("::2"))
    assert len(embedded(ipaddress.ip_address("::1"))) == 1


def test_the_client_follows_no_redirect_reads_no_environment_and_passes_its_timeouts(tls, monkeypatch):
    from edge.transport import checked_client

    port, client_tls = tls
    monkeypatch.setenv("NETRC", "/nonexistent")
    client = checked_client(UriPolicy(allow_private_addresses=True), verify=client_tls, timeout_s=3.5)
    assert client.follow_redirects is False and client.trust_env is False
    assert client.timeout == httpx.Timeout(3.5)
    transport = client._transport
    seen: list[httpcore.Request] = []
    handle = transport._pool.handle_request
    monkeypatch.setattr(transport._pool, "handle_request", lambda request: seen.append(request) or handle(request))
    ROUTES["/plain"] = (200, {}, b"ok")
    with client:
        response = client.get(f"https://127.0.0.1:{port}/plain")
    assert seen[0].extensions["timeout"] == {"connect": 3.5, "read": 3.5, "write": 3.5, "pool": 3.5}
    # the test server speaks HTTP/1.0: the extensions are the connection's, not httpx's defaults
    assert response.http_version == "HTTP/1.0" and "network_stream" in response.extensions


# --- any text: admitted or refused, never another error (issue 22) -----------------------------------

PIECES = st.one_of(st.sampled_from(["\x00", "%00", "%0", "%", "\ud800", "\udfff", " ", "\t", "\n", "\u2028",
                                    "\x85", "\xa0", "\x7f", "[", "]", "[::1", "@", ":", "/", "..", "%2e", "%2F",
                                    "localhost", "8.8.8.8", "m.gguf", "a" * 70]),
                   st.text(max_size=6))
HOSTILE_URIS = st.builds(lambda scheme, pieces: scheme + "".join(pieces),
                         st.sampled_from(["file://", "file:", "https://", "hf://", "http://", "", "ftp://"]),
                         st.lists(PIECES, max_size=10))


def _unsafe(uri: str) -> bool:
    """What no admitted URI may hold: a NUL (raw or %00), a lone surrogate, whitespace or a control."""
    return "%00" in uri or any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cs") for ch in uri)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(uri=HOSTILE_URIS)
def test_any_text_is_admitted_or_refused_never_another_error(roots, uri):
    root, _ = roots
    policy = UriPolicy(allow_file=True, file_roots=(root,), resolver=fixed("8.8.8.8"))
    for call in (lambda: policy.check(uri), lambda: policy.check(uri, directory=True),
                 lambda: policy.local_path(uri, must_exist=False), lambda: policy.check_url(uri)):
        try:
            call()
        except UriRefusedError:
            continue
        assert not _unsafe(uri), uri


@pytest.mark.parametrize("uri", ["file:///models/m%00.gguf", "file:///models/m\x00.gguf", "file:///models/\ud800",
                                 "file:///models/a b", "https://h.example/a%00", "https://[::1/x", "https://h\x00.example/",
                                 "hf://o/r@" + "a" * 40 + "/x\ny"])
def test_nul_surrogates_whitespace_and_broken_hosts_are_refusals(roots, uri):
    root, _ = roots
    uri = uri.replace("/models", str(root))
    with pytest.raises(UriRefusedError):
        UriPolicy(allow_file=True, file_roots=(root,), resolver=fixed("8.8.8.8")).check(uri)


def test_a_refusal_names_no_root_and_no_symlink_target(roots):
    root, outside = roots
    (root / "link.gguf").symlink_to(outside / "secret.gguf")
    (root / "gone.gguf").symlink_to(outside / "missing.gguf")
    policy = rooted(root)
    for uri, shown in (((root / "link.gguf").as_uri(), root / "link.gguf"),
                       ((outside / "secret.gguf").as_uri(), outside / "secret.gguf")):
        with pytest.raises(UriRefusedError) as info:
            policy.check(uri)
        assert str(info.value) == f"{shown} is outside the allowed file roots"
    (outside / "missing.gguf").write_bytes(b"")
    (root / "inner.gguf").symlink_to(root / "m.gguf.moved")
    with pytest.raises(UriRefusedError) as info:
        policy.local_path((root / "inner.gguf").as_uri())
    assert str(info.value) == f"{root / 'inner.gguf'} does not exist" and "moved" not in str(info.value)
