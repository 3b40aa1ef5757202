"""The pages' cookie is a signed, expiring reference to a token, not the bearer token (issue 22, info):
a copied cookie reads the pages until it expires or the token is revoked, and calls no API."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app, no_loops
from service.api.ui_sessions import SESSION_SECONDS, UiSessions
from service.auth import Role
from tests.service.conftest import add_token, settings_for


@pytest.fixture
def client(sqlite_url, tmp_path):
    app = create_app(settings_for(sqlite_url, tmp_path, dispatcher="none"), loops=no_loops)
    with TestClient(app, base_url="https://testserver") as test_client:
        test_client.database = sqlite_url
        yield test_client


def test_the_cookie_is_not_the_token_and_authorises_no_api_call(client):
    operator = add_token(client.database, Role.OPERATOR)
    login = client.post("/ui/login", data={"token": operator}, follow_redirects=False)
    assert login.status_code == 303
    cookie = client.cookies["convgate_token"]
    assert operator not in cookie and operator not in login.headers["set-cookie"]
    assert client.get("/ui/queue").status_code == 200
    with TestClient(client.app, base_url="https://testserver") as other:
        assert other.get("/v1/queue", headers={"Authorization": f"Bearer {cookie}"}).status_code == 401
        other.cookies["convgate_token"] = operator  # the raw token is no cookie either
        assert other.get("/ui/queue").status_code == 401


@pytest.mark.parametrize("tamper", [lambda c: c[:-1] + ("0" if c[-1] != "0" else "1"),
                                    lambda c: c.replace(".", "x", 1), lambda c: "v1." + "0" * 64 + ".9999999999.00"],
                         ids=["mac", "shape", "forged"])
def test_a_tampered_cookie_is_refused(client, tamper):
    client.post("/ui/login", data={"token": add_token(client.database, Role.OPERATOR)}, follow_redirects=False)
    client.cookies["convgate_token"] = tamper(client.cookies["convgate_token"])
    assert client.get("/ui/queue").status_code == 401


def test_a_cookie_expires_on_the_server_whatever_the_browser_keeps(tmp_path):
    now = [1_000_000.0]
    sessions = UiSessions(settings_for("sqlite://", tmp_path), clock=lambda: now[0])
    cookie = sessions.issue("secret")
    assert sessions.token_sha256(cookie) is not None
    now[0] += SESSION_SECONDS + 1
    assert sessions.token_sha256(cookie) is None
