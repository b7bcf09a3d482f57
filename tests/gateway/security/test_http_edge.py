"""The HTTP edge against slow and greedy clients, on a real server: a request whose headers never finish is
closed, connections over the cap are closed at once, and an honest client is still answered."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from gwtest import GLOBEX, INVOICE, with_id
from sectest import RealServer

from gateway.http import edge
from gateway.http.app import create_app
from gateway.runtime.serving import Runtime


@pytest.fixture()
def real(make_assembly, monkeypatch) -> Iterator[RealServer]:
    monkeypatch.setattr(edge.EdgeHttpProtocol, "header_timeout", 4.0)
    monkeypatch.setattr(edge.EdgeHttpProtocol, "max_connections", 8)
    assembly = make_assembly()
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        with RealServer(create_app(assembly, runtime=runtime)) as server:
            yield server
    finally:
        runtime.stop()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes *sock* within *within* seconds (reads until end of stream)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if sock.recv(65536) == b"":
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return False


def test_headers_sent_a_byte_at_a_time_are_cut_off(real):
    sock = socket.create_connection(("127.0.0.1", real.port))
    try:
        sock.sendall(b"POST /v1/documents HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer x")  # never finished
        assert _closed_by_server(sock, 20), "a request whose headers never end must not hold its connection"
    finally:
        sock.close()


def test_an_idle_connection_that_never_sends_is_cut_off(real):
    sock = socket.create_connection(("127.0.0.1", real.port))
    try:
        assert _closed_by_server(sock, 20)
    finally:
        sock.close()


def test_connections_over_the_cap_are_closed_and_honest_clients_still_served(real):
    held = [socket.create_connection(("127.0.0.1", real.port)) for _ in range(8)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n")  # headers in progress: the cap is reached
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", real.port))
        try:
            assert _closed_by_server(extra, 2.5)  # closed at once, well before the header deadline (4 s)
        finally:
            extra.close()
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 20  # the held connections are gone: room again
    while True:
        try:
            r = httpx.post(real.base + "/v1/documents", content=with_id(INVOICE, "EDGE-1"), headers=GLOBEX, timeout=60)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert r.status_code == 202
