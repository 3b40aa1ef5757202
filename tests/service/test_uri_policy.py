"""Submitted URIs pass a policy: https only to public addresses (loopback, link-local incl. the
metadata service, private ranges refused), also on every redirect hop; file:// only when enabled."""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest
import trustme

from service.uri_policy import UriPolicy, UriRefusedError
from tests.integration.test_fetch import ROUTES, serve
from worker.fetch import ContentStore, FetchError, FetchPolicy, fetch_artifact

PUBLIC_ONLY = UriPolicy(allow_file=False)


@pytest.mark.parametrize(
    "uri",
    ["https://127.0.0.1/x.gguf", "https://[::1]/x.gguf", "https://169.254.169.254/latest/meta-data",
     "https://metadata.google.internal/computeMetadata/v1/", "https://10.0.0.8/x.gguf", "https://192.168.1.2/x",
     "https://172.16.5.4/x", "https://[fe80::1]/x", "https://0.0.0.0/x", "https://localhost/x.gguf",
     "http://8.8.8.8/x.gguf", "file:///etc/passwd", "ftp://8.8.8.8/x"],
)
def test_refused_uris(uri):
    with pytest.raises(UriRefusedError):
        PUBLIC_ONLY.check(uri)


def test_public_literal_addresses_and_pinned_hf_uris_pass():
    PUBLIC_ONLY.check("https://8.8.8.8/model.gguf")
    PUBLIC_ONLY.check("hf://org/model@0123456789abcdef0123456789abcdef01234567/model.gguf")
    with pytest.raises(UriRefusedError):
        PUBLIC_ONLY.check("hf://org/model@main/model.gguf")


def test_allowed_hosts_and_file_switch():
    policy = UriPolicy(allow_file=True, allowed_hosts=("8.8.8.8",))
    policy.check("file:///models/m.gguf")
    policy.check("https://8.8.8.8/m.gguf")
    with pytest.raises(UriRefusedError, match="allowed hosts"):
        policy.check("https://1.1.1.1/m.gguf")


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
    "target", ["https://169.254.169.254/latest/meta-data/iam", "https://10.1.2.3/m.gguf", "https://localhost:{port}/m"]
)
def test_redirect_to_a_forbidden_address_is_refused_before_connecting(tls, tmp_path, target):
    port, client = tls
    ROUTES["/hop"] = (302, {"Location": target}, b"")
    # the mirror itself is trusted (an internal host the operator named); where it redirects is not
    policy = UriPolicy(allow_file=False, trusted_hosts=("127.0.0.1",))
    fetch = FetchPolicy(verify=client, timeout_s=5, check_url=policy.fetch_hook)
    with pytest.raises(FetchError, match="redirect refused") as info:
        fetch_artifact(f"https://127.0.0.1:{port}/hop", None, ContentStore(tmp_path), fetch)
    assert info.value.code == "artifact.fetch_failed"
