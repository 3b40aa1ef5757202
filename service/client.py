"""A small API client for the CLI (`submit`, `status`, `report`): httpx, errors translated once."""

from __future__ import annotations

import os
from typing import Any

import httpx

from engine.errors import ConvgateError

DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(ConvgateError):
    """The server answered with an error status; `detail` is its error body's message."""

    code = "client.api_error"

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=url or os.environ.get("CONVGATE_URL", DEFAULT_URL), timeout=timeout,
                                 headers={"Authorization": f"Bearer {token or os.environ.get('CONVGATE_TOKEN', '')}"})

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"{type(exc).__name__}: {exc}") from exc
        if response.is_error:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, str(detail))
        return response

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self._call("POST", "/v1/verifications", json=body, headers=headers).json()

    def get(self, verification_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/verifications/{verification_id}").json()

    def report(self, verification_id: str, accept: str = "application/json") -> str:
        return self._call("GET", f"/v1/verifications/{verification_id}/report", headers={"Accept": accept}).text
