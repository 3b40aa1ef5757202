"""Fetching by URI at the edge, into the content-addressed cache: a real local HTTPS server
(certificate from a throwaway CA) and a local endpoint that answers as the Hugging Face hub does.
Transient failures (reset, 5xx, 429) are retried with bounded backoff and, if they persist, end
without a verdict; definitive answers (404, digest mismatch, refusal) are NO-GO blockers."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from edge.download import FetchPolicy
from edge.errors import FetchError, TransientFetchError
from edge.fetch import fetch_artifact, fetch_source, fetch_split_artifact
from edge.retry import RetryPolicy
from edge.store import ContentStore
from edge.uri_policy import UriPolicy

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


ROUTES: dict[str, tuple[int, dict[str, str], bytes]] = {}
# path -> failures still to serve before the route answers: ("reset" | status, headers)
FAILURES: dict[str, list[tuple[int | str, dict[str, str]]]] = {}
HITS: Counter[str] = Counter()


class Handler(BaseHTTPRequestHandler):

    def log_message(self, *args) -> None:  # keep test output clean
        return None

    def _answer(self, with_body: bool) -> None:
        path = self.path.split("?", 1)[0]  # a presigned URL's query string does not change the route
        HITS[path] += 1
        if FAILURES.get(path):
            failure, headers = FAILURES[path].pop(0)
            if failure == "reset":
                self.close_connection = True
                return
            self._send(int(failure), headers, b"busy", with_body)
            return
        status, headers, body = ROUTES.get(path, (404, {}, b"not found"))
        self._send(status, headers, body, with_body)

    def _send(self, status: int, headers: dict[str, str], body: bytes, with_body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value.replace("{port}", str(self.server.server_address[1])))
        self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(True)

    def do_HEAD(self) -> None:
        self._answer(False)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(True)


def serve(tls: ssl.SSLContext | None) -> Iterator[tuple[str, int]]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def https_server(ca) -> Iterator[int]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost", "files.example").configure_cert(context)
    yield from (port for _, port in serve(context))


@pytest.fixture
def client_tls(ca) -> ssl.SSLContext:
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return client


SLEEPS: list[float] = []
FAST_RETRY = RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=0.05, sleep=SLEEPS.append)
LOCAL = UriPolicy(allowed_hosts=("127.0.0.1",), allow_private_addresses=True)


@pytest.fixture
def policy(client_tls) -> FetchPolicy:
    SLEEPS.clear()
    return FetchPolicy(uris=LOCAL, verify=client_tls, max_bytes=1 << 20, timeout_s=5, retry=FAST_RETRY)


@pytest.fixture
def store(tmp_path) -> ContentStore:
    return ContentStore(tmp_path / "cache")


ROUTES.update({
    "/model.gguf": (200, {}, PAYLOAD),
    "/redirect-ok": (302, {"Location": "/model.gguf"}, b""),
    "/redirect-http": (302, {"Location": "http://127.0.0.1:{port}/model.gguf"}, b""),
    "/redirect-other-host": (302, {"Location": "https://localhost:{port}/model.gguf"}, b""),
    "/loop": (302, {"Location": "/loop"}, b""),
    "/huge": (200, {"Content-Length": str(1 << 30)}, b""),
    "/missing": (404, {}, b"no"),
    "/gone": (410, {}, b"gone"),
})


def url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def nothing_left_behind(store: ContentStore) -> bool:
    stored = list((store.root / "sha256").rglob("*")) if (store.root / "sha256").exists() else []
    temps = list((store.root / "tmp").iterdir()) if (store.root / "tmp").exists() else []
    return not stored and not temps


def test_https_download_lands_under_its_digest(https_server, policy, store):
    path = fetch_artifact(url(https_server, "/model.gguf"), PAYLOAD_SHA, store, policy)
    assert path == store.path_for(PAYLOAD_SHA) and path.read_bytes() == PAYLOAD
    # a second fetch is served from the cache, even when the server no longer has it
    assert fetch_artifact(url(https_server, "/missing"), PAYLOAD_SHA, store, policy) == path


def test_redirect_within_policy_is_followed(https_server, policy, store):
    assert fetch_artifact(url(https_server, "/redirect-ok"), None, store, policy).read_bytes() == PAYLOAD


@pytest.mark.parametrize(
    ("path", "message"),
    [("/redirect-http", "only https"), ("/redirect-other-host", "not in the allowed hosts"), ("/loop", "redirects"),
     ("/huge", "exceed"), ("/missing", "404"), ("/gone", "410")],
)
def test_definitive_refusals_are_blockers_and_leave_nothing_behind(https_server, policy, store, path, message):
    HITS.clear()
    with pytest.raises(FetchError, match=message) as info:
        fetch_artifact(url(https_server, path), None, store, policy)
    assert info.value.code == "artifact.fetch_failed"
    assert nothing_left_behind(store)
    assert SLEEPS == []  # a definitive answer is never retried
    if path != "/loop":
        assert HITS[path] == 1


def test_wrong_digest_is_refused_and_not_cached(https_server, policy, store):
    with pytest.raises(FetchError) as info:
        fetch_artifact(url(https_server, "/model.gguf"), "0" * 64, store, policy)
    assert info.value.code == "artifact.sha256_mismatch"
    assert not store.path_for(PAYLOAD_SHA).exists() and not store.path_for("0" * 64).exists()


@pytest.mark.parametrize("failures", [
    [(503, {}), (503, {})], [("reset", {}), ("reset", {})], [(429, {"Retry-After": "0"})], [(500, {}), (502, {})]],
    ids=["503-twice", "reset-twice", "429-retry-after", "500-then-502"])
def test_transient_failures_are_retried_with_backoff_then_succeed(https_server, policy, store, failures):
    route = f"/flaky-{len(HITS)}-{len(failures)}"
    ROUTES[route] = (200, {}, PAYLOAD)
    FAILURES[route] = list(failures)
    HITS.clear()
    path = fetch_artifact(url(https_server, route), PAYLOAD_SHA, store, policy)
    assert path.read_bytes() == PAYLOAD
    assert HITS[route] == len(failures) + 1
    expected = [0.0] if failures[0][1].get("Retry-After") == "0" else [0.01, 0.02]
    assert expected == SLEEPS


def test_a_server_that_always_fails_is_transient_not_a_verdict(https_server, policy, store):
    route = "/always-503"
    FAILURES[route] = [(503, {})] * 10
    HITS.clear()
    with pytest.raises(TransientFetchError, match=r"503.*gave up after 3 tries") as info:
        fetch_artifact(url(https_server, route), None, store, policy)
    assert not isinstance(info.value, FetchError)
    assert HITS[route] == 3 and SLEEPS == [0.01, 0.02]
    assert nothing_left_behind(store)


def test_retry_after_beyond_the_bound_gives_up_at_once(https_server, policy, store):
    route = "/slow-down"
    FAILURES[route] = [(429, {"Retry-After": "3600"})] * 3
    HITS.clear()
    with pytest.raises(TransientFetchError, match="429"):
        fetch_artifact(url(https_server, route), None, store, policy)
    assert HITS[route] == 1 and SLEEPS == []


def test_backoff_doubles_and_is_bounded():
    retry = RetryPolicy(attempts=6, backoff_s=1.0, max_backoff_s=5.0)
    assert [retry.delay(n, None) for n in range(1, 7)] == [1.0, 2.0, 4.0, 5.0, 5.0, None]
    assert retry.delay(1, 5.0) == 5.0 and retry.delay(1, 5.5) is None and retry.delay(6, 0.0) is None


def test_unreachable_host_is_transient(policy, store):
    with pytest.raises(TransientFetchError, match="ConnectError"):
        fetch_artifact("https://127.0.0.1:1/x.gguf", None, store, policy)


def test_plain_http_and_untrusted_certificates_are_refused(https_server, store):
    with pytest.raises(FetchError, match="unsupported URI scheme 'http'"):
        fetch_artifact(f"http://127.0.0.1:{https_server}/model.gguf", None, store, FetchPolicy(uris=LOCAL))
    with pytest.raises(FetchError, match=r"certificate") as info:
        fetch_artifact(url(https_server, "/model.gguf"), None, store, FetchPolicy(uris=LOCAL, timeout_s=5))
    assert info.value.code == "artifact.fetch_failed"


def test_connection_goes_to_the_checked_address_with_the_name_for_tls(https_server, client_tls, store, monkeypatch):
    """No second lookup: the socket goes to the address the policy checked, TLS verifies the name."""
    import socket

    asked: list[str] = []
    system = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: asked.append(host) or system(host, *a, **k))

    def resolver(host: str):
        import ipaddress
        asked.append(f"policy:{host}")
        return [ipaddress.ip_address("127.0.0.1")]

    uris = UriPolicy(allow_private_addresses=True, resolver=resolver)
    policy = FetchPolicy(uris=uris, verify=client_tls, timeout_s=5, retry=FAST_RETRY)
    path = fetch_artifact(f"https://FILES.example:{https_server}/model.gguf", None, store, policy)
    assert path.read_bytes() == PAYLOAD
    assert asked.count("policy:files.example") == 1
    assert not any("files.example" in host.lower() for host in asked if not host.startswith("policy:"))


def test_a_host_that_resolves_to_a_private_address_is_never_connected(store, monkeypatch):
    import ipaddress
    import socket

    def no_connect(*args, **kwargs):
        raise AssertionError("connected to a refused address")

    monkeypatch.setattr(socket, "create_connection", no_connect)
    for answer in (["10.0.0.1"], ["8.8.8.8", "127.0.0.1"], ["64:ff9b::a9fe:a9fe"]):
        uris = UriPolicy(resolver=lambda host, answer=answer: [ipaddress.ip_address(a) for a in answer])
        with pytest.raises(FetchError, match="refused"):
            fetch_artifact("https://rebind.example/x.gguf", None, store, FetchPolicy(uris=uris, retry=FAST_RETRY))


def test_file_uri_needs_a_root(tmp_path, store):
    artifact = tmp_path / "a.gguf"
    artifact.write_bytes(PAYLOAD)
    rooted = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(tmp_path,)))
    assert fetch_artifact(artifact.as_uri(), None, store, rooted) == artifact.resolve()
    with pytest.raises(FetchError, match="disabled"):
        fetch_artifact(artifact.as_uri(), None, store, FetchPolicy(uris=UriPolicy(allow_file=False)))
    with pytest.raises(FetchError, match="no file roots"):
        fetch_artifact(artifact.as_uri(), None, store, FetchPolicy(uris=UriPolicy(allow_file=True)))


def hub_routes(repo: str, name: str, body: bytes, lfs_sha: str) -> None:
    """Answer as the hub does for one LFS file at COMMIT."""
    resolve = f"/{repo}/resolve/{COMMIT}/{name}"
    headers = {"X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{lfs_sha}"', "X-Linked-Size": str(len(body)),
               "ETag": f'"{lfs_sha}"'}
    ROUTES[resolve] = (200, headers, body)
    info = [{"type": "file", "path": name, "size": len(body), "oid": "f" * 40,
             "lfs": {"oid": lfs_sha, "size": len(body), "pointerSize": 134}}]
    ROUTES[f"/api/models/{repo}/paths-info/{COMMIT}"] = (200, {"Content-Type": "application/json"},
                                                                 json.dumps(info).encode())


@pytest.fixture(scope="module")
def hub() -> Iterator[str]:
    yield from (f"http://127.0.0.1:{port}" for _, port in serve(None))


def hub_policy(hub: str, **uris) -> FetchPolicy:
    """The operator's hub endpoint (plain http, loopback: a trusted internal mirror)."""
    return FetchPolicy(uris=UriPolicy(trusted_hosts=("127.0.0.1",), **uris), hf_endpoint=hub, timeout_s=5,
                       retry=FAST_RETRY)


def test_hf_uri_pinned_commit_lfs_digest_checked(hub, store):
    hub_routes("org/model", "model-Q8_0.gguf", PAYLOAD, PAYLOAD_SHA)
    path = fetch_artifact(f"hf://org/model@{COMMIT}/model-Q8_0.gguf", PAYLOAD_SHA, store, hub_policy(hub))
    assert path == store.path_for(PAYLOAD_SHA) and path.read_bytes() == PAYLOAD


def test_hf_lfs_digest_disagreeing_with_content_is_refused(hub, store):
    hub_routes("org/liar", "model.gguf", PAYLOAD, "e" * 64)
    with pytest.raises(FetchError, match="LFS") as info:
        fetch_artifact(f"hf://org/liar@{COMMIT}/model.gguf", None, store, hub_policy(hub))
    assert info.value.code == "artifact.sha256_mismatch"
    assert nothing_left_behind(store)


@pytest.mark.parametrize("target", ["https://169.254.169.254/blob", "https://cdn.example/blob",
                                    "https://[64:ff9b::a9fe:a9fe]/blob", "http://localhost:{port}/elsewhere"])
def test_hf_cdn_redirect_hop_is_checked(hub, store, target):
    import ipaddress

    hub_routes("org/cdn", "model.gguf", PAYLOAD, PAYLOAD_SHA)
    ROUTES[f"/org/cdn/resolve/{COMMIT}/model.gguf"] = (302, {"Location": target}, b"")
    # the mirror is trusted; cdn.example resolves to a private address, and only the endpoint may be http
    policy = hub_policy(hub, resolver=lambda host: [ipaddress.ip_address(
        "127.0.0.1" if host == "127.0.0.1" else "10.1.2.3" if host == "cdn.example" else host)])
    with pytest.raises(FetchError, match="refused") as info:
        fetch_artifact(f"hf://org/cdn@{COMMIT}/model.gguf", None, store, policy)
    assert info.value.code == "artifact.fetch_failed"


@pytest.mark.parametrize("uri", ["hf://org/model@main/model.gguf", "hf://org/model/model.gguf"])
def test_hf_uri_without_pinned_commit_is_refused(uri, store):
    with pytest.raises(FetchError, match="40-hex"):
        fetch_artifact(uri, None, store, FetchPolicy())


def test_tmp_is_clean_after_success(https_server, policy, store):
    fetch_artifact(url(https_server, "/model.gguf"), None, store, policy)
    assert not list(Path(store.root / "tmp").iterdir())


def test_hf_source_snapshot_at_a_pinned_commit(hub, store):
    from engine.digests import digest_tree

    files = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"\0" * 64}
    ROUTES[f"/api/models/org/src/revision/{COMMIT}"] = (200, {"Content-Type": "application/json"}, json.dumps(
        {"id": "org/src", "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}).encode())
    for name, body in files.items():
        etag = hashlib.sha256(body).hexdigest()
        ROUTES[f"/org/src/resolve/{COMMIT}/{name}"] = (200, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)
    root = fetch_source(f"hf://org/src@{COMMIT}", store, hub_policy(hub))
    # only the repository's files: the report lists every file of the snapshot as the source's
    assert sorted(p.name for p in root.iterdir()) == ["config.json", "model.safetensors"]
    digests = {Path(d.uri).name: d.sha256 for d in digest_tree(root, f"hf://org/src@{COMMIT}")}
    assert digests == {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
    with pytest.raises(FetchError, match="40-hex"):
        fetch_source("hf://org/src@main", store, hub_policy(hub))


@pytest.mark.parametrize("name", ["../escape.json", "/etc/passwd", "a/../../b"])
def test_hf_snapshot_with_unsafe_file_names_is_refused(hub, store, name):
    ROUTES[f"/api/models/org/evil/revision/{COMMIT}"] = (200, {"Content-Type": "application/json"}, json.dumps(
        {"id": "org/evil", "sha": COMMIT, "siblings": [{"rfilename": name}]}).encode())
    with pytest.raises(FetchError, match="unsafe file names"):
        fetch_source(f"hf://org/evil@{COMMIT}", store, hub_policy(hub))


SHARDS = [b"GGUF" + bytes([number]) * 512 for number in (1, 2, 3)]
ROUTES.update({f"/split/m-0000{number}-of-00003.gguf": (200, {}, body) for number, body in enumerate(SHARDS, 1)})


def test_a_split_is_fetched_shard_by_shard_under_its_names(https_server, policy, store):
    """Every shard by its own digest into the store; the first returned with its siblings beside it under
    their published names, as llama.cpp looks for them."""
    digests = tuple(hashlib.sha256(body).hexdigest() for body in SHARDS)
    first = fetch_split_artifact(url(https_server, "/split/m-00001-of-00003.gguf"), digests, store, policy)
    assert first.name == "m-00001-of-00003.gguf"
    assert [(first.parent / f"m-0000{n}-of-00003.gguf").read_bytes() for n in (1, 2, 3)] == SHARDS
    assert all(store.path_for(sha).is_file() for sha in digests)


def test_a_split_shard_with_another_digest_is_refused_and_not_cached(https_server, policy, store):
    digests = (hashlib.sha256(SHARDS[0]).hexdigest(), "0" * 64, hashlib.sha256(SHARDS[2]).hexdigest())
    with pytest.raises(FetchError) as refused:
        fetch_split_artifact(url(https_server, "/split/m-00001-of-00003.gguf"), digests, store, policy)
    assert refused.value.code == "artifact.sha256_mismatch" and not store.path_for("0" * 64).exists()


def test_a_split_named_by_another_shard_or_count_is_refused(https_server, policy, store):
    digests = tuple(hashlib.sha256(body).hexdigest() for body in SHARDS)
    for path in ("/split/m-00002-of-00003.gguf", "/model.gguf"):
        with pytest.raises(FetchError, match="does not name the first of 3 shards") as refused:
            fetch_split_artifact(url(https_server, path), digests, store, policy)
        assert refused.value.code == "artifact.split_index_mismatch"
    with pytest.raises(FetchError, match="first of 2 shards"):
        fetch_split_artifact(url(https_server, "/split/m-00001-of-00003.gguf"), digests[:2], store, policy)


def test_a_local_split_shard_outside_the_roots_is_refused(tmp_path, store):
    inside, outside = tmp_path / "models", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    for number, body in enumerate(SHARDS, 1):
        (inside if number != 2 else outside).joinpath(f"m-0000{number}-of-00003.gguf").write_bytes(body)
    (inside / "m-00002-of-00003.gguf").symlink_to(outside / "m-00002-of-00003.gguf")
    roots = FetchPolicy(uris=UriPolicy(allow_file=True, file_roots=(inside,)))
    digests = tuple(hashlib.sha256(body).hexdigest() for body in SHARDS)
    with pytest.raises(FetchError, match="refused"):
        fetch_split_artifact((inside / "m-00001-of-00003.gguf").as_uri(), digests, store, roots)
