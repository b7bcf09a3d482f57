"""The listener over raw sockets: malformed input, errors, heart-beats, flow control."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from broker_core import Queue
from broker_core.stomp import StompServer
from broker_core.stomp._frames import Frame, FrameParser, encode


class Raw:
    def __init__(self, port: int, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.settimeout(5)
        self.parser = FrameParser("1.2")
        self.frames: list[Frame] = []
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self, command: str, body: bytes = b"", **headers: Any) -> None:
        self.send(encode(Frame(command, {k.replace("_", "-"): str(v) for k, v in headers.items()}, body)))

    def connect(self, **headers: Any) -> Frame:
        headers.setdefault("accept_version", "1.2")
        headers.setdefault("host", "localhost")
        headers.setdefault("login", "user")
        headers.setdefault("passcode", "pw")
        self.frame("CONNECT", **headers)
        reply = self.next()
        assert reply.command == "CONNECTED", reply
        return reply

    def next(self, timeout: float = 5) -> Frame:
        deadline = time.monotonic() + timeout
        while not self.frames:
            if self.eof:
                raise EOFError("connection closed")
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                self.eof = True
                continue
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def closed_by_server(self, timeout: float = 5) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                return False
            if not data:
                return True
        return False

    def close(self) -> None:
        self.sock.close()


def expect_error(raw: Raw, text: str) -> Frame:
    frame = raw.next()
    assert frame.command == "ERROR", frame
    assert text in frame.headers["message"], frame
    assert frame.body, "the body says what was wrong"
    assert raw.closed_by_server()
    return frame


def still_works(port: int) -> None:
    raw = Raw(port)
    raw.connect()
    raw.frame("SUBSCRIBE", destination="/queue/ok", id="1")
    raw.frame("SEND", b"fine", destination="/queue/ok")
    assert raw.next().body == b"fine"
    raw.close()


@pytest.mark.parametrize(
    "data,text",
    [
        (b"\x00\x01garbage\xff\n\n\x00", "malformed frame"),
        (b"NOT A COMMAND\n\n\x00", "malformed frame"),
        (b"SEND\nno colon here\n\n\x00", "malformed frame"),
        (b"SEND\ndestination:/queue/a\ncontent-length:2\n\nabcdef\x00", "malformed frame"),
        (b"SEND\nh:" + b"x" * 70000, "malformed frame"),
        (b"SEND\ndestination:/queue/a\nbad:\\t\n\n\x00", "malformed frame"),
    ],
)
def test_malformed_frames_get_error_and_close(server, data, text):
    other = Raw(server.port)
    other.connect()
    other.frame("SUBSCRIBE", destination="/queue/other", id="o")
    raw = Raw(server.port)
    raw.connect()
    raw.send(data)
    expect_error(raw, text)
    other.frame("SEND", b"unaffected", destination="/queue/other")
    assert other.next().body == b"unaffected"
    still_works(server.port)


def test_frame_before_connect(server):
    raw = Raw(server.port)
    raw.frame("SEND", b"x", destination="/queue/a")
    expect_error(raw, "not connected")


def test_unknown_command(server):
    raw = Raw(server.port)
    raw.connect()
    raw.frame("FROBNICATE", receipt="r-9")
    frame = expect_error(raw, "unknown command")
    assert frame.headers["receipt-id"] == "r-9"


def test_missing_destination(server):
    raw = Raw(server.port)
    raw.connect()
    raw.frame("SEND", b"x", receipt="r1")
    frame = expect_error(raw, "missing destination")
    assert frame.headers["receipt-id"] == "r1"


@pytest.mark.parametrize("dest,text", [("/bogus/a", "InvalidDestinationError"), ("/queue/", "InvalidDestinationError")])
def test_invalid_destination(server, dest, text):
    raw = Raw(server.port)
    raw.connect()
    raw.frame("SEND", b"x", destination=dest)
    expect_error(raw, text)


def test_oversize_body(start_server, broker):
    srv = start_server(broker, heartbeat=(0, 0), max_frame_size=1000)
    raw = Raw(srv.port)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/a\n\n" + b"x" * 5000)
    expect_error(raw, "malformed frame")
    raw = Raw(srv.port)
    raw.connect()
    raw.frame("SEND", b"x" * 2000, destination="/queue/a", content_length=2000)
    expect_error(raw, "malformed frame")


def test_protocol_errors(server):
    for frames, text in [
        ([("SUBSCRIBE", {"destination": "/queue/a"})], "missing id"),
        ([("SUBSCRIBE", {"destination": "/queue/a", "id": "1", "ack": "sometimes"})], "invalid ack"),
        (
            [
                ("SUBSCRIBE", {"destination": "/queue/a", "id": "1"}),
                ("SUBSCRIBE", {"destination": "/queue/b", "id": "1"}),
            ],
            "duplicate subscription",
        ),
        ([("UNSUBSCRIBE", {"id": "nope"})], "unknown subscription"),
        ([("ACK", {"id": "12345"})], "unknown ack id"),
        ([("COMMIT", {"transaction": "t"})], "unknown transaction"),
        ([("BEGIN", {"transaction": "t"}), ("BEGIN", {"transaction": "t"})], "already begun"),
        ([("SEND", {"destination": "/queue/a", "transaction": "zz"})], "unknown transaction"),
        ([("SEND", {"destination": "/queue/a", "priority": "11"})], "priority"),
        ([("CONNECT", {"accept-version": "1.2"})], "already connected"),
    ]:
        raw = Raw(server.port)
        raw.connect()
        for command, headers in frames:
            raw.send(encode(Frame(command, dict(headers))))
        expect_error(raw, text)
    still_works(server.port)


def test_version_negotiation(server):
    raw = Raw(server.port)
    raw.frame("CONNECT", accept_version="2.0,3.1")
    frame = raw.next()
    assert frame.command == "ERROR" and frame.headers["version"] == "1.0,1.1,1.2"
    assert raw.closed_by_server()
    raw = Raw(server.port)
    raw.send(b"CONNECT\nlogin:user\npasscode:pw\n\n\x00")  # a 1.0 client: no accept-version
    assert raw.connect.__name__ and raw.next().headers["version"] == "1.0"
    raw = Raw(server.port)
    assert raw.connect(accept_version="1.0,1.1").headers["version"] == "1.1"
    raw = Raw(server.port)
    raw.frame("STOMP", accept_version="1.2", host="x", login="user", passcode="pw")
    assert raw.next().command == "CONNECTED"


def test_split_reads_and_many_frames_per_read(server):
    raw = Raw(server.port)
    raw.connect()
    data = encode(Frame("SUBSCRIBE", {"destination": "/queue/s", "id": "1"}))
    data += b"\r\n\n" + b"".join(
        encode(Frame("SEND", {"destination": "/queue/s", "n": str(i)}, b"b%d" % i)) for i in range(50)
    )
    for i in range(0, len(data), 7):
        raw.send(data[i : i + 7])
        time.sleep(0.0005)
    assert [raw.next().body for _ in range(50)] == [b"b%d" % i for i in range(50)]


def test_header_escaping_on_the_wire(server):
    raw = Raw(server.port)
    raw.connect()
    raw.frame("SUBSCRIBE", destination="/queue/esc", id="s:1")
    raw.send(b"SEND\ndestination:/queue/esc\nx-odd\\cname:line1\\nline2\\\\\n\nb\x00")
    frame = raw.next()
    assert frame.headers["x-odd:name"] == "line1\nline2\\"
    assert frame.headers["subscription"] == "s:1"


def test_disconnect_receipt_then_close(server):
    raw = Raw(server.port)
    raw.connect()
    raw.frame("DISCONNECT", receipt="77")
    frame = raw.next()
    assert frame.command == "RECEIPT" and frame.headers["receipt-id"] == "77"
    assert raw.closed_by_server()


def test_server_sends_heartbeats(start_server, broker):
    srv = start_server(broker, heartbeat=(100, 0))
    raw = Raw(srv.port)
    reply = raw.connect(heart_beat="0,100")
    assert reply.headers["heart-beat"] == "100,0"
    time.sleep(0.5)
    raw.sock.settimeout(1)
    data = raw.sock.recv(100)
    assert data and set(data) == {10}


def test_silent_client_is_disconnected(start_server, broker):
    srv = start_server(broker, heartbeat=(0, 100))
    raw = Raw(srv.port)
    raw.connect(heart_beat="100,0")
    start = time.monotonic()
    frame = raw.next(3)
    assert frame.command == "ERROR" and "heart-beat" in frame.headers["message"]
    assert raw.closed_by_server()
    assert time.monotonic() - start < 2


def test_client_heartbeats_keep_connection(start_server, broker):
    srv = start_server(broker, heartbeat=(0, 100))
    raw = Raw(srv.port)
    raw.connect(heart_beat="100,0")
    for _ in range(10):
        raw.send(b"\n")
        time.sleep(0.08)
    raw.frame("SUBSCRIBE", destination="/queue/hb", id="1")
    raw.frame("SEND", b"alive", destination="/queue/hb")
    assert raw.next().body == b"alive"


def test_slow_consumer_does_not_drain_queue(server, broker):
    jms = broker.connect()
    session = jms.create_session()
    producer = session.create_producer(None)
    message = session.create_bytes_message(b"x" * 2048)
    for _ in range(20000):
        producer.send(Queue("slow"), message, delivery_mode=1)
    raw = Raw(server.port, rcvbuf=64 * 1024)
    raw.connect()
    raw.frame("SUBSCRIBE", destination="/queue/slow", id="1", ack="auto")
    time.sleep(1.0)  # the client reads nothing
    depth = broker.stats("queue://slow").depth
    assert depth > 15000, depth  # only what fits in the socket buffers left the queue
    assert raw.next().command == "MESSAGE"
    jms.close()


def test_auth_rejects_wrong_passcode(start_server, broker, stomp_user):
    srv = start_server(broker, users=[stomp_user("alice", "secret")], heartbeat=(0, 0))
    raw = Raw(srv.port)
    raw.frame("CONNECT", accept_version="1.2", login="alice", passcode="nope")
    expect_error(raw, "authentication failed")
    time.sleep(1.2)  # a failure makes the address wait a second before its next check
    raw = Raw(srv.port)
    raw.connect(login="alice", passcode="secret")


def test_port_zero_and_stop(broker, stomp_user):
    import asyncio

    async def run() -> int:
        server = StompServer(broker, port=0, heartbeat=(0, 0), users=[stomp_user()])
        await server.start()
        port = server.port
        await server.stop()
        return port

    assert asyncio.run(run()) > 0


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=300))
def test_fuzz_live_server_with_random_bytes(server, data):
    raw = Raw(server.port)
    raw.connect()
    raw.send(data + b"\x00")
    raw.frame("DISCONNECT", receipt="end")
    try:  # either an ERROR (then close) or the frames were valid and we get the receipt
        frames = [raw.next(2) for _ in range(3)]
    except (TimeoutError, EOFError, ConnectionResetError):
        frames = []
    assert all(f.command in ("ERROR", "RECEIPT", "MESSAGE") for f in frames)
    raw.close()
    still_works(server.port)
