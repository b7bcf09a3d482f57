"""The STOMP listener's bounds, each hit over a real socket: connections, frames
before CONNECT, the CONNECT delay, per-connection resources, transactions and
memory for non-persistent messages (producer flow control)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pytest

from broker_core import Queue
from broker_core.stomp import StompLimits

sys.path.insert(0, os.path.dirname(__file__))  # the raw-socket helpers of the neighbouring tests
from test_server import Raw, expect_error, still_works


def limited(start_server: Any, broker: Any, **limits: Any) -> Any:
    return start_server(broker, heartbeat=(0, 0), limits=StompLimits(**limits))


def test_connections_beyond_the_limit_are_refused_before_anything_is_read(start_server, broker):
    srv = limited(start_server, broker, connections=3)
    held = [Raw(srv.port) for _ in range(3)]
    for raw in held:
        raw.connect()
    extra = Raw(srv.port)
    frame = extra.next()
    assert frame.command == "ERROR" and frame.headers["message"] == "too many connections"
    assert extra.closed_by_server()
    held.pop().close()
    deadline = time.monotonic() + 5
    while srv.server.connections >= 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    Raw(srv.port).connect()


def test_connections_per_user(start_server, broker, stomp_user):
    srv = start_server(
        broker,
        heartbeat=(0, 0),
        users=[stomp_user(), stomp_user("other", "o")],
        limits=StompLimits(connections_per_user=2),
    )
    a, b = Raw(srv.port), Raw(srv.port)
    a.connect()
    b.connect()
    raw = Raw(srv.port)
    raw.frame("CONNECT", accept_version="1.2", login="user", passcode="pw")
    expect_error(raw, "too many connections for this user")
    Raw(srv.port).connect(login="other", passcode="o")  # other users are not affected


@pytest.mark.parametrize(
    "data",
    [
        b"CONNECT\naccept-version:1.2\nx:" + b"a" * 20000 + b"\n\n\x00",  # headers
        b"CONNECT\naccept-version:1.2\ncontent-length:1000000\n\n" + b"a" * 20000,  # a body announced
        b"CONNECT\naccept-version:1.2\n\n" + b"a" * 20000,  # a body never ended
        b"SEND\ndestination:/queue/a\n\n" + b"a" * 20000,  # any frame before CONNECT
    ],
)
def test_frames_before_connect_are_small(start_server, broker, data):
    srv = limited(start_server, broker, connect_frame_bytes=8192)
    raw = Raw(srv.port)
    try:
        raw.send(data)
    except (BrokenPipeError, ConnectionResetError):
        pass
    frame = raw.next()
    assert frame.command == "ERROR"
    assert raw.closed_by_server()
    still_works(srv.port)


def test_after_connect_frames_may_be_as_large_as_max_frame_size(start_server, broker):
    srv = start_server(broker, heartbeat=(0, 0), max_frame_size=100_000, limits=StompLimits(connect_frame_bytes=1024))
    raw = Raw(srv.port)
    raw.connect()
    raw.frame("SUBSCRIBE", destination="/queue/big", id="1")
    raw.frame("SEND", b"b" * 50_000, destination="/queue/big")
    assert len(raw.next().body) == 50_000


def test_a_client_that_never_connects_is_dropped(start_server, broker):
    srv = limited(start_server, broker, connect_timeout=0.5)
    silent = Raw(srv.port)
    slow = Raw(srv.port)
    slow.send(b"CONN")  # a few bytes at a time, never a whole frame
    expect_error(silent, "connect timeout")
    frame = slow.next()
    assert frame.command == "ERROR" and frame.headers["message"] == "connect timeout"
    deadline = time.monotonic() + 5
    while srv.server.connections and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.server.connections == 0


@pytest.mark.parametrize(
    "limit, frames, message",
    [
        (
            "subscriptions",
            lambda i: ("SUBSCRIBE", {"destination": f"/queue/s{i}", "id": str(i)}),
            "too many subscriptions",
        ),
        ("transactions", lambda i: ("BEGIN", {"transaction": f"t{i}"}), "too many transactions"),
        (
            "temporary_destinations",
            lambda i: ("SUBSCRIBE", {"destination": f"/temp-queue/t{i}", "id": str(i)}),
            "too many temporary destinations",
        ),
    ],
)
def test_per_connection_resources_are_bounded(start_server, broker, limit, frames, message):
    srv = limited(start_server, broker, **{limit: 5})
    raw = Raw(srv.port)
    raw.connect()
    for i in range(5):
        command, headers = frames(i)
        raw.frame(command, receipt=f"r{i}", **headers)
        assert raw.next().command == "RECEIPT"
    command, headers = frames(5)
    raw.frame(command, **headers)
    expect_error(raw, message)
    still_works(srv.port)


def test_an_open_transaction_holds_a_bounded_number_of_messages(start_server, broker):
    srv = limited(start_server, broker, transaction_messages=100)
    raw = Raw(srv.port)
    raw.connect()
    raw.frame("BEGIN", transaction="t")
    for _i in range(101):
        raw.frame("SEND", b"x", destination="/queue/tx", transaction="t")
    frame = expect_error(raw, "transaction too large")
    assert b"commit more often" in frame.body
    assert broker.stats("queue://tx").depth == 0  # nothing of the aborted transaction was sent
    deadline = time.monotonic() + 5
    while srv.server.memory_held and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.server.memory_held == 0  # the staged messages are forgotten


def _flood(port: int, body: bytes, count: int, persistent: bool = False) -> tuple[int, Any]:
    """Send *count* messages as fast as the socket takes them; (sent, the ERROR frame or None)."""
    raw = Raw(port)
    raw.connect()
    frame = (
        b"SEND\ndestination:/queue/flood\npersistent:"
        + (b"true" if persistent else b"false")
        + b"\ncontent-length:"
        + str(len(body)).encode()
        + b"\n\n"
        + body
        + b"\x00"
    )
    sent = 0
    raw.sock.settimeout(30)
    try:
        for _ in range(count):
            raw.send(frame)
            sent += 1
    except (TimeoutError, BrokenPipeError, ConnectionResetError):
        pass
    try:
        return sent, raw.next(10)
    except (TimeoutError, EOFError, ConnectionResetError):
        return sent, None


def test_non_persistent_messages_beyond_the_memory_limit_are_refused_not_kept(start_server, broker):
    limit = 2 * 1024 * 1024
    srv = limited(start_server, broker, memory_bytes=limit, send_wait=0.5)
    sent, error = _flood(srv.port, b"m" * 10_000, 1000)  # 10 MB at a queue nobody reads
    assert error is not None and error.command == "ERROR" and error.headers["message"] == "memory limit reached"
    assert b"consume what was sent" in error.body
    held = srv.server.memory_held
    assert held <= limit + 11_000, held  # at most one message over
    depth = broker.stats("queue://flood").depth
    assert 0 < depth < 1000 and depth * 10_000 <= limit + 10_000
    # the queue is full: a new non-persistent SEND waits, then is refused too, and the process is fine
    _, error = _flood(srv.port, b"m" * 10, 1)
    assert error is not None and error.headers["message"] == "memory limit reached"
    with broker.connect() as conn:  # once the queue is read, there is room again
        conn.start()
        consumer = conn.create_session().create_consumer(Queue("flood"))
        while consumer.receive(0.5) is not None:
            pass
    still_works(srv.port)


def test_a_producer_faster_than_its_consumer_is_slowed_not_refused(start_server, broker):
    limit = 1024 * 1024
    srv = limited(start_server, broker, memory_bytes=limit, send_wait=20)
    received = []
    stop = threading.Event()

    def consume() -> None:
        with broker.connect() as conn:
            conn.start()
            consumer = conn.create_session().create_consumer(Queue("flood"))
            while not stop.is_set() and len(received) < 500:
                message = consumer.receive(0.2)
                if message is not None:
                    received.append(message)
                    time.sleep(0.002)  # slower than the producer

    thread = threading.Thread(target=consume)
    thread.start()
    try:
        raw = Raw(srv.port)
        raw.connect()
        for _ in range(500):  # 5 MB through a 1 MB budget
            raw.frame("SEND", b"p" * 10_000, destination="/queue/flood", **{"content-length": 10_000})
            assert srv.server.memory_held <= limit + 10_000 + 600
        raw.frame("DISCONNECT", receipt="done")
        assert raw.next(60).command == "RECEIPT"
        thread.join(60)
    finally:
        stop.set()
        thread.join(10)
    assert len(received) == 500
