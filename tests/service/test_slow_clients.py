"""Slow connections are timed out (issue 34): a red team held 3,000 connections with partial headers and
1,000 with partial bodies on `convgate serve` for as long as it tried. The server now gives a request's
line and headers `header_timeout_seconds` from its first byte (not renewed by each byte that trickles in)
and its body `body_timeout_seconds` from the headers (service/api/serving.py). Measured on the real
server process with raw sockets, with deadlines of one second so the test is quick."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from service.persistence.migrate import upgrade
from tests.service.serve_process import ServeProcess, serve_process

DEADLINE = 1.0  # both timeouts, in this test's server
MARGIN = 4.0  # a loaded 2-core machine: the close may come this much after the deadline
CONNECTIONS = 200


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServeProcess]:
    """One server for the module: every test leaves it as it found it (its own connections closed)."""
    folder = tmp_path_factory.mktemp("slow-clients")
    url = f"sqlite:///{folder / 'convgate.db'}"
    upgrade(url)
    with serve_process(url, folder, header_timeout_seconds=str(DEADLINE),
                       body_timeout_seconds=str(DEADLINE)) as served:
        yield served


@contextmanager
def connection(server: ServeProcess) -> Iterator[socket.socket]:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    try:
        yield sock
    finally:
        sock.close()


def closed_within(sock: socket.socket, seconds: float) -> tuple[float, bytes]:
    """Wait (up to `seconds`) for the server to close `sock`; (how long it took, what it sent first)."""
    started = time.monotonic()
    sock.settimeout(seconds)
    received = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            raise AssertionError(f"still open after {seconds} s") from None
        except ConnectionResetError:
            return time.monotonic() - started, received
        if not chunk:
            return time.monotonic() - started, received
        received += chunk


def test_partial_headers_are_answered_408_and_closed(server):
    with connection(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: convgate\r\n")
        took, answer = closed_within(sock, DEADLINE + MARGIN)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert took < DEADLINE + MARGIN


def test_a_trickle_of_header_bytes_does_not_renew_the_deadline(server):
    """One byte at a time, each well within the deadline of the one before: the request is still late."""
    request = b"GET /healthz HTTP/1.1\r\nHost: convgate\r\nX-Slow: " + b"a" * 1000
    with connection(server) as sock:
        started = time.monotonic()
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sock.settimeout(DEADLINE / 4)  # the trickle's pace: each byte waits this long for an answer
            try:
                sock.recv(4096)  # the 408, or the close
                break
            except TimeoutError:
                continue
        else:
            raise AssertionError("the server took the whole trickle")
        took = time.monotonic() - started
    assert took < DEADLINE + MARGIN, f"{took:.1f} s"


def test_a_partial_body_is_cut_off(server):
    with connection(server) as sock:
        sock.sendall(b"POST /v1/verifications HTTP/1.1\r\nHost: convgate\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"source_uri\": ")
        took, _ = closed_within(sock, DEADLINE + MARGIN)
    assert took < DEADLINE + MARGIN


def test_many_slow_connections_are_all_closed_and_the_server_still_answers(server):
    sockets = []
    try:
        for index in range(CONNECTIONS):
            host, port = server.url.removeprefix("http://").split(":")
            sock = socket.create_connection((host, int(port)), timeout=10)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: convgate\r\n" if index % 2 else
                         b"POST /v1/verifications HTTP/1.1\r\nHost: c\r\nContent-Length: 99\r\n\r\n{")
            sockets.append(sock)
        for sock in sockets:
            closed_within(sock, DEADLINE + MARGIN)
    finally:
        for sock in sockets:
            sock.close()
    assert httpx.get(f"{server.url}/healthz", timeout=10).text == "ok"


def test_an_idle_keep_alive_connection_is_not_a_late_request(server):
    """Between requests a connection is idle, not late: only uvicorn's keep-alive timeout (5 s) applies, and
    the next request gets a deadline of its own."""
    request = b"GET /healthz HTTP/1.1\r\nHost: convgate\r\n\r\n"
    with connection(server) as sock:
        sock.sendall(request)
        assert answer(sock).startswith(b"HTTP/1.1 200 ")
        sock.settimeout(DEADLINE * 2)
        with pytest.raises(TimeoutError):
            sock.recv(4096)  # nothing, for twice the header deadline: the connection stays open
        sock.sendall(request)
        assert answer(sock).startswith(b"HTTP/1.1 200 ")


def answer(sock: socket.socket) -> bytes:
    """One whole answer of /healthz (its body is `ok`), however the server split it."""
    sock.settimeout(10)
    received = b""
    while not received.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, received
        received += chunk
    return received
