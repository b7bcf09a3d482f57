"""gateway.http.protocol: a response sent before its request's body was read ends the connection in stages
(RFC 9112, section 9.6): the answer, then the server's end of the connection, while what the client still
sends is discarded; the client reads the whole answer however it sends. Over a real uvicorn server with
the gateway's protocol, driven with raw sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from gateway.http import edge
from gateway.http import protocol as http_protocol


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    if scope["path"] == "/chunks":  # a streamed answer: no length, three writes of its body
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/early":  # answers at once, never reads the body (like a 429)
        body = b'{"code":"too-many-concurrent-requests"}'
    else:
        size = 0
        while True:
            message = await receive()
            size += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"read %d" % size
    await send(
        {
            "type": "http.response.start",
            "status": 429 if scope["path"] == "/early" else 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="off", **edge.protocol_options())
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield sock.getsockname()[1]
    server.should_exit = True
    thread.join(10)


def _head(path: str, length: int) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {length}\r\n\r\n".encode()


def _read_all(conn: socket.socket, timeout: float = 10) -> bytes:
    conn.settimeout(timeout)
    data = b""
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_a_client_sending_its_whole_body_after_an_early_answer_reads_the_answer_then_the_end(port):
    body = b"x" * (8 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_head("/early", len(body)))
        conn.sendall(body)  # never refused: the server discards what it does not read
        answer = _read_all(conn)
    assert answer.startswith(b"HTTP/1.1 429 ")
    assert answer.endswith(b'{"code":"too-many-concurrent-requests"}')  # whole, then the connection's end


def test_the_server_ends_its_side_right_after_an_early_answer(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_head("/early", 10_000_000) + b"x" * 1000)
        started = time.monotonic()
        answer = _read_all(conn)  # the end comes while the client has sent almost nothing of the body
        assert time.monotonic() - started < 2
    assert answer.startswith(b"HTTP/1.1 429 ")


def test_a_client_sending_past_the_drain_limit_is_cut_off(port, monkeypatch):
    monkeypatch.setattr(http_protocol, "LINGER_BYTES", 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(_head("/early", 100_000_000))
        cut = False
        try:
            for _ in range(100_000_000 // 65536):
                conn.sendall(b"x" * 65536)
        except (ConnectionResetError, BrokenPipeError):
            cut = True
        assert cut, "the server drained without a limit"


def test_a_request_whose_body_was_read_keeps_its_connection(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        for _ in range(2):  # two requests on one connection: the early-answer path is not taken
            conn.sendall(_head("/read", 5) + b"hello")
            answer = b""
            while not answer.endswith(b"read 5"):
                chunk = conn.recv(65536)
                assert chunk, "the server closed a connection it had read the request of"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 ")


def test_a_client_that_keeps_sending_wakes_the_drain_at_most_once_a_pause(port, monkeypatch):
    calls = []
    drain = http_protocol._Drain.drain

    def counted(self):
        calls.append(time.monotonic())
        return drain(self)

    monkeypatch.setattr(http_protocol._Drain, "drain", counted)
    monkeypatch.setattr(http_protocol, "LINGER_BYTES", 1 << 40)  # not cut off meanwhile
    seconds = 1.0
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(_head("/early", 1_000_000_000))
        started = time.monotonic()
        while time.monotonic() - started < seconds:  # a fast client, sending in small segments
            conn.sendall(b"x" * 4096)
        conn.shutdown(socket.SHUT_WR)
        answer = _read_all(conn)
    assert answer.startswith(b"HTTP/1.1 429 ")
    assert calls, "nothing was drained"
    assert len(calls) <= seconds / http_protocol.DRAIN_PAUSE + 3  # not one wake-up per segment


def test_the_event_loop_never_drains(port, monkeypatch):
    """What a client sends after an early answer is discarded by the drainer's thread: the event loop's
    time is its other requests'."""
    threads = set()
    drain = http_protocol._Drain.drain

    def recorded(self):
        threads.add(threading.current_thread().name)  # the server's event loop runs on its own thread
        return drain(self)

    monkeypatch.setattr(http_protocol._Drain, "drain", recorded)
    body = b"x" * (4 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(_head("/early", len(body)))
        conn.sendall(body)
        answer = _read_all(conn)  # the end of the connection comes before the drain (it may start at once)
    assert answer.startswith(b"HTTP/1.1 429 ")
    deadline = time.monotonic() + http_protocol.LINGER_SECONDS
    while not threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads == {"b2bgw-http-drain"}


def test_a_client_expecting_100_continue_gets_it_before_it_sends_the_body(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.settimeout(10)
        conn.sendall(b"POST /read HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        interim = conn.recv(65536)  # the server asks for the body when it reads it: nothing is sent yet
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n")
        conn.sendall(b"hello")
        conn.sendall(b"GET /chunks HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answers = _read_all(conn)
    first, _, rest = answers.partition(b"read 5")
    assert first.startswith(b"HTTP/1.1 200 ") and b"content-length: 6" in first.lower()
    assert rest.startswith(b"HTTP/1.1 200 ")


def test_a_streamed_answer_arrives_whole_in_its_chunks(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /chunks HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        answer = _read_all(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower()
    assert body == b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n"
