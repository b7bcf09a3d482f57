"""Persistent SENDs through the listener on the SQL store (SQLite).

The rules: a RECEIPT for a persistent SEND is written once the message is
committed and synced, and once every frame before it is processed (STOMP
1.2, RECEIPT); one producer's messages reach a consumer in the order they
were sent (JMS 4.4.10); ``client`` acknowledges cumulatively, ``client-
individual`` one message, and what is left unacknowledged when the
connection goes is delivered again, marked redelivered (STOMP 1.2, SUBSCRIBE
ack header). SENDs arrive many to a read here (each test writes its frames
in a few large writes), as they do from a streaming producer.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from broker_core import Broker
from broker_core.stomp import hash_passcode
from broker_core.stomp._frames import Frame, FrameParser, encode

ROOT = Path(__file__).resolve().parents[3]


def frame(command: str, body: bytes = b"", **headers: Any) -> bytes:
    return encode(Frame(command, {k.replace("_", "-"): str(v) for k, v in headers.items()}, body))


class Wire:
    """A STOMP 1.2 client on a raw socket: writes frames as they are given (many per write)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.parser = FrameParser("1.2")
        self.frames: list[Frame] = []

    def write(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def connect(self) -> None:
        self.write(frame("CONNECT", accept_version="1.2", host="localhost", login="user", passcode="pw"))
        assert self.next().command == "CONNECTED"

    def next(self, timeout: float = 10) -> Frame:
        self.sock.settimeout(timeout)
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the server closed the connection")
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def messages(self, n: int) -> list[Frame]:
        out = []
        while len(out) < n:
            got = self.next()
            assert got.command == "MESSAGE", got
            out.append(got)
        return out

    def receipt(self, rid: str) -> None:
        got = self.next()
        assert got.command == "RECEIPT" and got.headers["receipt-id"] == rid, got

    def drop(self) -> None:
        """Gone without a DISCONNECT."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def sends(destination: str, first: int, last: int, **headers: Any) -> list[bytes]:
    return [
        frame("SEND", str(i).encode(), destination=destination, persistent="true", seq=i, **headers)
        for i in range(first, last)
    ]


@pytest.fixture
def sqlite_server(start_server: Any, sqlite_url: str) -> Any:
    broker = Broker.open(sqlite_url)
    server = start_server(broker, heartbeat=(0, 0))
    yield server
    broker.close()


def test_receipt_follows_the_durable_commit_of_every_send_before_it(sqlite_server):
    store = sqlite_server.broker.store
    committed: list[tuple[int, bool]] = []  # (messages, durable) of each commit whose callback ran
    commit = store.commit

    def recording(sends, acks, extra=(), callback=None, *, durable=True, finish_on=None):
        def done(error):
            if error is None:
                committed.append((len(sends), durable))
            callback(error)

        return commit(sends, acks, extra, done if callback else None, durable=durable, finish_on=finish_on)

    store.commit = recording
    wire = Wire(sqlite_server.port)
    wire.connect()
    frames = sends("/queue/receipted", 0, 300)
    frames[-1] = frame("SEND", b"299", destination="/queue/receipted", persistent="true", receipt="last")
    for start in range(0, 300, 100):
        wire.write(*frames[start : start + 100])
    wire.receipt("last")
    # on the loop's thread: what had completed when the RECEIPT was written
    assert sum(n for n, _ in committed) == 300
    assert all(durable for _, durable in committed)
    wire.write(frame("DISCONNECT", receipt="bye"))
    wire.receipt("bye")


def test_receipts_come_in_order_while_the_stream_goes_on(sqlite_server):
    store = sqlite_server.broker.store
    committed = [0]  # persistent messages in completed commits
    commit = store.commit

    def recording(sends, acks, extra=(), callback=None, *, durable=True, finish_on=None):
        def done(error):
            if error is None:
                committed[0] += len(sends)
            callback(error)

        return commit(sends, acks, extra, done if callback else None, durable=durable, finish_on=finish_on)

    store.commit = recording
    wire = Wire(sqlite_server.port)
    wire.connect()
    frames, asked = [], []
    for i in range(400):
        extra = {}
        if i % 50 == 49:
            extra = {"receipt": f"send-{i}"}
            asked.append((f"send-{i}", i + 1))
        frames.append(frame("SEND", b"x", destination="/queue/stream", persistent="true", **extra))
        if i == 200:  # another kind of frame asking for a receipt, in the middle of the stream
            frames.append(frame("SUBSCRIBE", destination="/queue/elsewhere", id="s", receipt="subscribed"))
            asked.append(("subscribed", i + 1))
    wire.write(*frames)
    for rid, sent_before in asked:
        got = wire.next()
        assert got.command == "RECEIPT" and got.headers["receipt-id"] == rid, got
        assert committed[0] >= sent_before
    wire.write(frame("DISCONNECT", receipt="bye"))
    wire.receipt("bye")


def test_receipts_asked_before_a_refused_frame_come_before_its_error(sqlite_server):
    wire = Wire(sqlite_server.port)
    wire.connect()
    wire.write(
        *sends("/queue/refused", 0, 20, receipt="stored"),
        frame("SEND", b"nowhere"),  # no destination
    )
    assert [wire.next().headers.get("receipt-id") for _ in range(20)] == ["stored"] * 20
    error = wire.next()
    assert error.command == "ERROR" and "destination" in error.headers["message"], error
    again = Wire(sqlite_server.port)
    again.connect()
    again.write(frame("SUBSCRIBE", destination="/queue/refused", id="s"))
    assert [int(m.headers["seq"]) for m in again.messages(20)] == list(range(20))
    again.write(frame("DISCONNECT", receipt="bye"))
    again.receipt("bye")


def test_one_producers_messages_arrive_in_order(sqlite_server):
    consumer = Wire(sqlite_server.port)
    consumer.connect()
    consumer.write(frame("SUBSCRIBE", destination="/queue/ordered", id="s", ack="client-individual"))
    producers = [Wire(sqlite_server.port) for _ in range(2)]

    def produce(wire: Wire, name: str) -> None:
        wire.connect()
        for start in range(0, 1000, 250):
            wire.write(*sends("/queue/ordered", start, start + 250, producer=name))
        wire.write(frame("DISCONNECT", receipt="done"))
        wire.receipt("done")

    threads = [threading.Thread(target=produce, args=(w, f"p{i}")) for i, w in enumerate(producers)]
    for thread in threads:
        thread.start()
    seen: dict[str, list[int]] = {"p0": [], "p1": []}
    for n in range(2000):
        try:
            message = consumer.messages(1)[0]
        except TimeoutError:
            raise AssertionError(f"nothing more after {n} messages; the last ones: {seen}") from None
        seen[message.headers["producer"]].append(int(message.headers["seq"]))
        consumer.write(frame("ACK", id=message.headers["ack"]))
    for thread in threads:
        thread.join()
    assert seen == {"p0": list(range(1000)), "p1": list(range(1000))}


def test_cumulative_ack_and_sends_in_one_read_then_redelivery(sqlite_server):
    wire = Wire(sqlite_server.port)
    wire.connect()
    wire.write(
        frame("SUBSCRIBE", destination="/queue/cumulative", id="s", ack="client"), *sends("/queue/cumulative", 0, 10)
    )
    got = wire.messages(10)
    assert [int(m.headers["seq"]) for m in got] == list(range(10))
    # one write: the ACK of the fifth (acknowledges 0-4), UNSUBSCRIBE (5-9 go back), two more SENDs
    wire.write(
        frame("ACK", id=got[4].headers["ack"]),
        frame("UNSUBSCRIBE", id="s"),
        *sends("/queue/cumulative", 10, 12),
        frame("DISCONNECT", receipt="bye"),
    )
    wire.receipt("bye")
    again = Wire(sqlite_server.port)
    again.connect()
    again.write(frame("SUBSCRIBE", destination="/queue/cumulative", id="s", ack="client-individual"))
    redelivered = again.messages(7)
    assert [int(m.headers["seq"]) for m in redelivered] == list(range(5, 12))
    assert [m.headers.get("redelivered") for m in redelivered] == ["true"] * 5 + ["false"] * 2
    for message in redelivered:
        again.write(frame("ACK", id=message.headers["ack"]))
    again.write(frame("DISCONNECT", receipt="bye"))
    again.receipt("bye")


def test_individual_acks_then_a_dropped_connection_redelivers_the_rest(sqlite_server):
    wire = Wire(sqlite_server.port)
    wire.connect()
    wire.write(
        frame("SUBSCRIBE", destination="/queue/individual", id="s", ack="client-individual"),
        *sends("/queue/individual", 0, 6),
    )
    got = wire.messages(6)
    wire.write(
        *(frame("ACK", id=got[i].headers["ack"]) for i in (1, 3, 5)),
        frame("SEND", b"s", destination="/queue/x", receipt="acked"),
    )
    wire.receipt("acked")
    wire.drop()
    again = Wire(sqlite_server.port)
    again.connect()
    again.write(frame("SUBSCRIBE", destination="/queue/individual", id="s", ack="client-individual"))
    redelivered = again.messages(3)
    assert [int(m.headers["seq"]) for m in redelivered] == [0, 2, 4]
    assert all(m.headers["redelivered"] == "true" for m in redelivered)
    for message in redelivered:
        again.write(frame("ACK", id=message.headers["ack"]))
    again.write(frame("DISCONNECT", receipt="bye"))
    again.receipt("bye")


# ------------------------------------------------------------------ a killed listener


def _start_listener(url: str, user_hash: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "broker_core.stomp", "--url", url, "--port", "0", "--heartbeat", "0,0"]
        + ["--log-level", "WARNING", "--user", f"user:{user_hash}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"STOMP listening on [\d.]+:(\d+)", line)
        if found:
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, int(found.group(1))
    proc.wait()
    raise AssertionError("the listener did not start")


def test_every_receipted_send_survives_a_killed_listener(sqlite_url):
    user_hash = hash_passcode("pw")
    proc, port = _start_listener(sqlite_url, user_hash)
    receipted: list[int] = []
    try:
        wire = Wire(port)
        wire.connect()
        receipts = threading.Event()

        def read_receipts() -> None:
            try:
                while True:
                    got = wire.next(timeout=60)
                    if got.command == "RECEIPT":
                        receipted.append(int(got.headers["receipt-id"]))
                        if len(receipted) >= 20:
                            receipts.set()
            except (EOFError, OSError):
                receipts.set()

        reader = threading.Thread(target=read_receipts, daemon=True)
        reader.start()
        # 100 persistent SENDs per write, a receipt asked for on every tenth; killed once 20 receipts came
        first = 0
        try:
            while not receipts.is_set() and first < 100_000:
                batch = []
                for i in range(first, first + 100):
                    extra = {"receipt": i} if i % 10 == 9 else {}
                    batch.append(
                        frame("SEND", str(i).encode(), destination="/queue/crash", persistent="true", seq=i, **extra)
                    )
                first += 100
                wire.write(*batch)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            reader.join(10)
        assert len(receipted) >= 20
    finally:
        if proc.poll() is None:
            proc.kill()
    last = max(receipted)
    proc, port = _start_listener(sqlite_url, user_hash)
    try:
        wire = Wire(port)
        wire.connect()
        wire.write(frame("SUBSCRIBE", destination="/queue/crash", id="s", ack="auto"))
        seen: list[int] = []
        while len(seen) <= last:  # every message up to the last receipted one, in order (what follows may be there)
            seen.append(int(wire.messages(1)[0].headers["seq"]))
        assert seen == list(range(last + 1))
        wire.write(frame("DISCONNECT", receipt="bye"))
    finally:
        proc.terminate()
        proc.wait(10)
