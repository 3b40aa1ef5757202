"""The total deadline of an exchange over the policy transport (`edge.deadline`): every operation of a
timed stream gets at most the time left, one started after the deadline fails at once with the timeout of
its kind, and outside a deadline nothing changes. The stream under it is a recording double: the socket's
own behaviour is not what is tested here (tests/service/test_callback_fairness.py drives a real tarpit)."""

from __future__ import annotations

import ssl
from typing import Any

import httpcore
import pytest

from edge.deadline import DeadlineStream, deadline, remaining


class Recorded(httpcore.NetworkStream):
    """Records the timeout each operation was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None]] = []
        self.tls: list[tuple[ssl.SSLContext, str | None]] = []

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.calls.append(("read", timeout))
        return b"x" * min(max_bytes, 1)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.calls.append(("write", timeout))

    def close(self) -> None:
        self.calls.append(("close", None))

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        self.calls.append(("start_tls", timeout))
        self.tls.append((ssl_context, server_hostname))
        return self

    def get_extra_info(self, info: str) -> Any:
        return f"info:{info}"


def test_outside_a_deadline_every_timeout_is_passed_as_given():
    inner = Recorded()
    stream = DeadlineStream(inner)
    assert stream.read(4, 2.5) == b"x"
    stream.write(b"ab", None)
    assert remaining(7.0, httpcore.ReadTimeout) == 7.0 and remaining(None, httpcore.ReadTimeout) is None
    assert inner.calls == [("read", 2.5), ("write", None)]


def test_inside_a_deadline_each_operation_gets_at_most_the_time_left():
    inner = Recorded()
    stream = DeadlineStream(inner)
    with deadline(5.0):
        stream.read(1, 60.0)  # a per-read timeout longer than the whole exchange: cut to what is left
        stream.write(b"a", None)  # none given: the time left
        stream.read(1, 0.25)  # a shorter one stands
    (_, first), (_, second), (_, third) = inner.calls
    assert 4.0 < first <= 5.0 and 4.0 < second <= first and third == 0.25


@pytest.mark.parametrize(("operation", "expired"), [
    (lambda stream: stream.read(1, 1.0), httpcore.ReadTimeout),
    (lambda stream: stream.write(b"a", 1.0), httpcore.WriteTimeout),
    (lambda stream: stream.start_tls(ssl.create_default_context(), "h", 1.0), httpcore.ConnectTimeout),
], ids=["read", "write", "tls"])
def test_an_operation_after_the_deadline_fails_at_once_with_its_own_timeout(operation, expired):
    inner = Recorded()
    with deadline(0.0), pytest.raises(expired, match="total deadline"):
        operation(DeadlineStream(inner))
    assert inner.calls == []  # the socket was never asked


def test_a_deadline_ends_with_its_block_and_nests():
    with deadline(100.0):
        with deadline(1.0):
            assert remaining(None, httpcore.ReadTimeout) <= 1.0
        assert remaining(None, httpcore.ReadTimeout) > 50.0
    assert remaining(3.0, httpcore.ReadTimeout) == 3.0


def test_tls_keeps_the_deadline_and_the_rest_is_passed_through():
    inner = Recorded()
    with deadline(5.0):
        upgraded = DeadlineStream(inner).start_tls(ssl.create_default_context(), "h", 60.0)
        assert isinstance(upgraded, DeadlineStream) and upgraded.stream is inner
        upgraded.read(1, 60.0)
    assert [name for name, _ in inner.calls] == ["start_tls", "read"]
    assert all(timeout is not None and timeout <= 5.0 for _, timeout in inner.calls)
    upgraded.close()
    assert inner.calls[-1] == ("close", None) and upgraded.get_extra_info("socket") == "info:socket"


def test_each_operation_passes_on_what_it_was_given():
    inner = Recorded()
    stream = DeadlineStream(inner)
    context = ssl.create_default_context()
    stream.write(b"ab", 3.0)
    secured = stream.start_tls(context, "models.example", 4.0)
    assert inner.calls == [("write", 3.0), ("start_tls", 4.0)]
    assert inner.tls == [(context, "models.example")]
    # the TLS stream keeps the deadline too
    assert isinstance(secured, DeadlineStream) and secured.stream is inner
    assert secured.get_extra_info("peer") == "info:peer"
