"""The control plane's listening ports must stay out of the kernel's ephemeral range: a port picked
at start and bound again later (Kueue restarted mid-session) can meanwhile be taken as the local end
of an outgoing connection, and Kueue then exits with "bind: address already in use" (a CI run
lost 18 cluster tests to that)."""

from __future__ import annotations

import socket

from .cluster import ephemeral_range, free_port


def test_free_ports_are_outside_the_ephemeral_range_and_distinct() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(not low <= p <= high for p in ports), ports
    assert len(set(ports)) == len(ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # still free: nothing took it
