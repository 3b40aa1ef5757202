"""Fetching by URI into the content-addressed cache: a real local HTTPS server (certificate from a
throwaway CA) and a local endpoint that answers as the Hugging Face hub does (HF_ENDPOINT)."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import trustme

from worker.fetch import ContentStore, FetchError, FetchPolicy, fetch_artifact

PAYLOAD = b"GGUF" + bytes(range(256)) * 64
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()
COMMIT = "0123456789abcdef0123456789abcdef01234567"


ROUTES: dict[str, tuple[int, dict[str, str], bytes]] = {}


class Handler(BaseHTTPRequestHandler):

    def log_message(self, *args) -> None:  # keep test output clean
        return None

    def _answer(self, with_body: bool) -> None:
        status, headers, body = ROUTES.get(self.path, (404, {}, b"not found"))
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
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    yield from (port for _, port in serve(context))


@pytest.fixture
def policy(ca) -> FetchPolicy:
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return FetchPolicy(verify=client, allowed_hosts=("127.0.0.1",), max_bytes=1 << 20, timeout_s=5)


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
})


def url(port: int, path: str) -> str:
    return f"https://127.0.0.1:{port}{path}"


def test_https_download_lands_under_its_digest(https_server, policy, store):
    path = fetch_artifact(url(https_server, "/model.gguf"), PAYLOAD_SHA, store, policy)
    assert path == store.path_for(PAYLOAD_SHA) and path.read_bytes() == PAYLOAD
    # a second fetch is served from the cache, even when the server no longer has it
    assert fetch_artifact(url(https_server, "/missing"), PAYLOAD_SHA, store, policy) == path


def test_redirect_within_policy_is_followed(https_server, policy, store):
    assert fetch_artifact(url(https_server, "/redirect-ok"), None, store, policy).read_bytes() == PAYLOAD


@pytest.mark.parametrize(
    ("path", "message"),
    [("/redirect-http", "only https"), ("/redirect-other-host", "not allowed"), ("/loop", "redirects"),
     ("/huge", "exceed"), ("/missing", "404")],
)
def test_refused_downloads_leave_nothing_behind(https_server, policy, store, path, message):
    with pytest.raises(FetchError, match=message) as info:
        fetch_artifact(url(https_server, path), None, store, policy)
    assert info.value.code == "artifact.fetch_failed"
    assert not list((store.root / "sha256").rglob("*")) if (store.root / "sha256").exists() else True
    assert not list((store.root / "tmp").iterdir())


def test_wrong_digest_is_refused_and_not_cached(https_server, policy, store):
    with pytest.raises(FetchError) as info:
        fetch_artifact(url(https_server, "/model.gguf"), "0" * 64, store, policy)
    assert info.value.code == "artifact.sha256_mismatch"
    assert not store.path_for(PAYLOAD_SHA).exists() and not store.path_for("0" * 64).exists()


def test_unreachable_host_is_a_clear_error(policy, store):
    with pytest.raises(FetchError, match="ConnectError") as info:
        fetch_artifact("https://127.0.0.1:1/x.gguf", None, store, policy)
    assert info.value.code == "artifact.fetch_failed"


def test_plain_http_and_untrusted_certificates_are_refused(https_server, store):
    with pytest.raises(FetchError, match="unsupported URI scheme 'http'"):
        fetch_artifact(f"http://127.0.0.1:{https_server}/model.gguf", None, store, FetchPolicy())
    with pytest.raises(FetchError, match=r"CERTIFICATE|SSL|certificate"):
        fetch_artifact(url(https_server, "/model.gguf"), None, store, FetchPolicy(timeout_s=5))


def test_file_uri_needs_to_be_enabled(tmp_path, store):
    artifact = tmp_path / "a.gguf"
    artifact.write_bytes(PAYLOAD)
    assert fetch_artifact(artifact.as_uri(), None, store, FetchPolicy()) == artifact
    with pytest.raises(FetchError, match="not enabled"):
        fetch_artifact(artifact.as_uri(), None, store, FetchPolicy(allow_file=False))


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


def test_hf_uri_pinned_commit_lfs_digest_checked(hub, store, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_routes("org/model", "model-Q8_0.gguf", PAYLOAD, PAYLOAD_SHA)
    policy = FetchPolicy(hf_endpoint=hub)
    path = fetch_artifact(f"hf://org/model@{COMMIT}/model-Q8_0.gguf", PAYLOAD_SHA, store, policy)
    assert path == store.path_for(PAYLOAD_SHA) and path.read_bytes() == PAYLOAD


def test_hf_lfs_digest_disagreeing_with_content_is_refused(hub, store, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub_routes("org/liar", "model.gguf", PAYLOAD, "e" * 64)
    with pytest.raises(FetchError, match="LFS") as info:
        fetch_artifact(f"hf://org/liar@{COMMIT}/model.gguf", None, store, FetchPolicy(hf_endpoint=hub))
    assert info.value.code == "artifact.sha256_mismatch"
    assert not list((store.root / "sha256").rglob("*")) if (store.root / "sha256").exists() else True


@pytest.mark.parametrize("uri", ["hf://org/model@main/model.gguf", "hf://org/model/model.gguf"])
def test_hf_uri_without_pinned_commit_is_refused(uri, store):
    with pytest.raises(FetchError, match="40-hex"):
        fetch_artifact(uri, None, store, FetchPolicy())


def test_wrong_digest_through_the_engine_is_a_no_go(https_server, policy, tmp_path, minilm):
    from worker.engine import VerifyRequest, verify
    from worker.policy import Policy

    request = VerifyRequest(source_uri=str(minilm / "source"), artifact_uri=url(https_server, "/model.gguf"),
                            expected_sha256="1" * 64, gates=frozenset({1}))
    report = verify(request, Policy(), ContentStore(tmp_path / "c"), policy)
    assert report.verdict == "NO-GO"
    assert [b.code for b in report.blockers] == ["artifact.sha256_mismatch"]


def test_tmp_is_clean_after_success(https_server, policy, store):
    fetch_artifact(url(https_server, "/model.gguf"), None, store, policy)
    assert not list(Path(store.root / "tmp").iterdir())


def test_hf_source_snapshot_at_a_pinned_commit(hub, store, monkeypatch):
    from worker.digests import digest_tree
    from worker.fetch import fetch_source

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    files = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"\0" * 64}
    ROUTES[f"/api/models/org/src/revision/{COMMIT}"] = (200, {"Content-Type": "application/json"}, json.dumps(
        {"id": "org/src", "sha": COMMIT, "siblings": [{"rfilename": name} for name in files]}).encode())
    for name, body in files.items():
        etag = hashlib.sha256(body).hexdigest()
        ROUTES[f"/org/src/resolve/{COMMIT}/{name}"] = (200, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)
    root = fetch_source(f"hf://org/src@{COMMIT}", store, FetchPolicy(hf_endpoint=hub))
    assert sorted(p.name for p in root.iterdir()) == ["config.json", "model.safetensors"]
    digests = {Path(d.uri).name: d.sha256 for d in digest_tree(root)}
    assert digests == {name: hashlib.sha256(body).hexdigest() for name, body in files.items()}
    with pytest.raises(FetchError, match="40-hex"):
        fetch_source("hf://org/src@main", store, FetchPolicy(hf_endpoint=hub))
