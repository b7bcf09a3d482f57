"""The STOMP listener driven by a real third-party client: stomp.py."""

from __future__ import annotations

import queue
import socket
import threading
import time
from typing import Any

import pytest
import stomp

from broker_core import (
    Broker,
    BytesMessage,
    DeliveryMode,
    Queue,
    Requestor,
    TextMessage,
    Topic,
    reply_correlation_id,
)


class Collector(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.messages: queue.Queue[Any] = queue.Queue()
        self.errors: list[Any] = []
        self.receipts: list[str] = []
        self.receipt_event = threading.Condition()

    def on_message(self, frame: Any) -> None:
        self.messages.put(frame)

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)

    def on_receipt(self, frame: Any) -> None:
        with self.receipt_event:
            self.receipts.append(frame.headers["receipt-id"])
            self.receipt_event.notify_all()

    def get(self, timeout: float = 5) -> Any:
        return self.messages.get(timeout=timeout)

    def take(self, n: int, timeout: float = 5) -> list[Any]:
        return [self.get(timeout) for _ in range(n)]

    def none(self, wait: float = 0.3) -> bool:
        try:
            self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def wait_receipt(self, rid: str, timeout: float = 5) -> None:
        with self.receipt_event:
            assert self.receipt_event.wait_for(lambda: rid in self.receipts, timeout), f"no receipt {rid}"


def client(port: int, version: str = "1.2", client_id: str | None = None, **kw: Any) -> tuple[Any, Collector]:
    cls = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}[version]
    conn = cls([("127.0.0.1", port)], **kw)
    listener = Collector()
    conn.set_listener("c", listener)
    headers = {"client-id": client_id} if client_id else {}
    conn.connect("user", "pw", wait=True, headers=headers)
    return conn, listener


def sync(conn: Any, listener: Collector) -> None:
    """Round trip a receipt: everything sent before is processed."""
    rid = f"sync-{time.monotonic_ns()}"
    conn.send("/queue/__sync", "", receipt=rid)
    listener.wait_receipt(rid)


@pytest.fixture
def port(server: Any) -> int:
    return server.port


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_send_and_receive_every_version(port, version):
    conn, listener = client(port, version)
    conn.subscribe("/queue/v", id="s1", ack="auto")
    conn.send("/queue/v", "hé llo", headers={"color": "red", "x-dash": "a:b"})
    frame = listener.get()
    assert frame.body == "hé llo"
    assert frame.headers["destination"] == "/queue/v"
    assert frame.headers["color"] == "red"
    assert frame.headers["x-dash"] == "a:b"
    assert frame.headers["redelivered"] == "false"
    assert frame.headers["message-id"].startswith("ID:")
    assert "ack" not in frame.headers  # auto mode: nothing to acknowledge
    conn.disconnect()


def test_python_sees_stomp_messages_as_jms(server, broker):
    conn, listener = client(server.port)
    jms = broker.connect()
    jms.start()
    session = jms.create_session()
    consumer = session.create_consumer(Queue("orders.inbound"))
    conn.send(
        "/queue/orders.inbound",
        b"\x00\x01binary",
        headers={"persistent": "true", "priority": "7", "correlation-id": "c-1", "type": "Order", "region": "EU"},
    )
    msg = consumer.receive(5)
    assert isinstance(msg, BytesMessage)  # content-length present (stomp.py always adds it)
    assert msg.get_body() == b"\x00\x01binary"
    assert msg.jms_delivery_mode == DeliveryMode.PERSISTENT
    assert msg.jms_priority == 7 and msg.jms_correlation_id == "c-1" and msg.jms_type == "Order"
    assert msg.get_string_property("region") == "EU"
    conn.send(
        "/queue/orders.inbound",
        "text",
        headers={"amq-msg-type": "text", "expires": str(int(time.time() * 1000) + 60000)},
    )
    msg = consumer.receive(5)
    assert isinstance(msg, TextMessage) and msg.text == "text" and msg.jms_expiration > 0
    assert msg.jms_delivery_mode == DeliveryMode.NON_PERSISTENT
    conn.disconnect()
    jms.close()


def test_no_content_length_gives_text_message(server, broker):
    conn, _ = client(server.port, auto_content_length=False)
    jms = broker.connect()
    jms.start()
    consumer = jms.create_session().create_consumer(Queue("t"))
    conn.send("/queue/t", "plain")
    msg = consumer.receive(5)
    assert isinstance(msg, TextMessage) and msg.text == "plain"
    conn.disconnect()
    jms.close()


def test_python_messages_reach_stomp_with_headers(server, broker):
    conn, listener = client(server.port)
    conn.subscribe("/topic/prices", id="p", ack="auto")
    sync(conn, listener)
    jms = broker.connect()
    session = jms.create_session()
    msg = session.create_text_message("42.0")
    msg.jms_correlation_id = "corr"
    msg.jms_type = "Price"
    msg.jms_reply_to = Queue("replies")
    msg.set_string_property("sym", "ACME")
    msg.set_int_property("qty", 5)
    msg.set_boolean_property("firm", True)
    session.create_producer(None).send(Topic("prices"), msg, priority=6, time_to_live=60000)
    bmsg = session.create_bytes_message(b"\x00\xff")
    session.create_producer(None).send(Topic("prices"), bmsg)
    frame = listener.get()
    h = frame.headers
    assert frame.body == "42.0"
    assert h["correlation-id"] == "corr" and h["type"] == "Price" and h["reply-to"] == "/queue/replies"
    assert h["priority"] == "6" and int(h["expires"]) > int(h["timestamp"]) > 0
    assert h["sym"] == "ACME" and h["qty"] == "5" and h["firm"] == "true" and h["subscription"] == "p"
    assert h["persistent"] == "true"
    frame = listener.get()
    assert frame.headers["content-length"] == "2"
    conn.disconnect()
    jms.close()


def test_binary_body_roundtrip(port):
    conn, listener = client(port, auto_decode=False)
    conn.subscribe("/queue/bin", id="b")
    body = bytes(range(256)) * 10
    conn.send("/queue/bin", body)
    assert listener.get().body == body
    conn.disconnect()


def test_receipts(port):
    conn, listener = client(port)
    conn.subscribe("/queue/r", id="r", receipt="sub-1")
    listener.wait_receipt("sub-1")
    conn.send("/queue/r", "x", receipt="send-1")
    listener.wait_receipt("send-1")
    conn.disconnect(receipt="bye")  # returns once sent: the server's RECEIPT comes on the client's reader thread
    listener.wait_receipt("bye")


def test_transactions_commit_and_abort(port):
    conn, listener = client(port)
    conn.subscribe("/queue/tx", id="t")
    tx = conn.begin()
    conn.send("/queue/tx", "one", transaction=tx)
    conn.send("/queue/tx", "two", transaction=tx)
    sync(conn, listener)
    assert listener.none()
    conn.commit(tx)
    assert [f.body for f in listener.take(2)] == ["one", "two"]
    tx = conn.begin()
    conn.send("/queue/tx", "never", transaction=tx)
    conn.abort(tx)
    sync(conn, listener)
    assert listener.none()
    conn.disconnect()


def test_transactional_ack_is_undone_by_abort(port):
    conn, listener = client(port)
    conn.subscribe("/queue/txa", id="t", ack="client-individual")
    conn.send("/queue/txa", "m")
    frame = listener.get()
    tx = conn.begin()
    conn.ack(frame.headers["ack"], transaction=tx)
    conn.abort(tx)
    again = listener.get()
    assert again.body == "m" and again.headers["redelivered"] == "true"
    tx = conn.begin()
    conn.ack(again.headers["ack"], transaction=tx)
    conn.commit(tx)
    sync(conn, listener)
    conn.disconnect()
    conn, listener = client(port)
    conn.subscribe("/queue/txa", id="t")
    assert listener.none()
    conn.disconnect()


def test_client_ack_is_cumulative(port):
    conn, listener = client(port)
    conn.subscribe("/queue/cum", id="c", ack="client")
    for i in range(5):
        conn.send("/queue/cum", str(i))
    frames = listener.take(5)
    conn.ack(frames[2].headers["ack"])  # acknowledges 0, 1, 2
    sync(conn, listener)
    conn.disconnect()
    conn, listener = client(port)
    conn.subscribe("/queue/cum", id="c", ack="client")
    again = listener.take(2)
    assert sorted(f.body for f in again) == ["3", "4"]
    assert all(f.headers["redelivered"] == "true" for f in again)
    assert listener.none()
    conn.disconnect()


def test_client_individual_ack(port):
    conn, listener = client(port)
    conn.subscribe("/queue/ind", id="c", ack="client-individual")
    for i in range(3):
        conn.send("/queue/ind", str(i))
    frames = listener.take(3)
    conn.ack(frames[1].headers["ack"])
    sync(conn, listener)
    conn.disconnect()
    conn, listener = client(port)
    conn.subscribe("/queue/ind", id="c", ack="client-individual")
    assert sorted(f.body for f in listener.take(2)) == ["0", "2"]
    conn.disconnect()


def test_stomp11_ack_by_message_id(port):
    conn, listener = client(port, "1.1")
    conn.subscribe("/queue/a11", id="s", ack="client")
    conn.send("/queue/a11", "x")
    frame = listener.get()
    conn.ack(frame.headers["message-id"], "s")
    sync(conn, listener)
    conn.disconnect()
    conn, listener = client(port, "1.1")
    conn.subscribe("/queue/a11", id="s")
    assert listener.none()
    conn.disconnect()


def test_nack_redelivers_then_dead_letters(start_server):
    broker = Broker.open("memory://", max_deliveries=3)
    try:
        server = start_server(broker, heartbeat=(0, 0))
        conn, listener = client(server.port)
        conn.subscribe("/queue/n", id="n", ack="client-individual")
        conn.send("/queue/n", "poison")
        seen = []
        for _ in range(3):
            frame = listener.get()
            seen.append(frame.headers["redelivered"])
            conn.nack(frame.headers["ack"])
        assert seen == ["false", "true", "true"]
        assert listener.none()
        conn.subscribe("/queue/DLQ.n", id="dlq")
        assert listener.get().body == "poison"
        conn.disconnect()
    finally:
        broker.close()


def test_unacked_messages_redelivered_after_drop(start_server, sqlite_url):
    broker = Broker.open(sqlite_url)
    try:
        server = start_server(broker, heartbeat=(0, 0))
        conn, listener = client(server.port)
        conn.subscribe("/queue/drop", id="d", ack="client-individual")
        for i in range(3):
            conn.send("/queue/drop", str(i), headers={"persistent": "true"})
        listener.take(3)
        sock = conn.transport.socket
        sock.shutdown(socket.SHUT_RDWR)  # a drop, no DISCONNECT
        sock.close()
        deadline = time.monotonic() + 5
        while server.server.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        conn2, listener2 = client(server.port)
        conn2.subscribe("/queue/drop", id="d", ack="client-individual")
        frames = listener2.take(3)
        assert sorted(f.body for f in frames) == ["0", "1", "2"]
        assert all(f.headers["redelivered"] == "true" for f in frames)
        for f in frames:
            conn2.ack(f.headers["ack"])
        sync(conn2, listener2)
        conn2.disconnect()
    finally:
        broker.close()


def test_durable_subscription_across_reconnects(port):
    conn, listener = client(port, client_id="backend-1")
    conn.subscribe("/topic/events", id="d", ack="client-individual", headers={"durable-subscription-name": "audit"})
    sync(conn, listener)
    conn.disconnect()
    pub, _ = client(port)
    pub.send("/topic/events", "while away", headers={"persistent": "true"})
    pub.disconnect()
    conn, listener = client(port, client_id="backend-1")
    conn.subscribe("/topic/events", id="d", ack="client-individual", headers={"activemq.subscriptionName": "audit"})
    frame = listener.get()
    assert frame.body == "while away"
    conn.ack(frame.headers["ack"])
    conn.unsubscribe("d", headers={"durable-subscription-name": "audit"})
    sync(conn, listener)
    conn.disconnect()


def test_durable_needs_client_id(port):
    conn, listener = client(port)
    conn.subscribe("/topic/x", id="d", headers={"durable-subscription-name": "n"})
    time.sleep(0.3)
    assert listener.errors and "client-id" in listener.errors[0].headers["message"]


def test_selectors(port):
    conn, listener = client(port)
    conn.subscribe("/queue/sel", id="s", headers={"selector": "region = 'EU' AND qty IN ('50', '60')"})
    conn.send("/queue/sel", "no", headers={"region": "US", "qty": "50"})
    conn.send("/queue/sel", "yes", headers={"region": "EU", "qty": "50"})
    assert listener.get().body == "yes"
    assert listener.none()
    conn.disconnect()


def test_invalid_selector_is_an_error(port):
    conn, listener = client(port)
    conn.subscribe("/queue/sel", id="s", headers={"selector": "region = "})
    time.sleep(0.3)
    assert listener.errors and "InvalidSelectorError" in listener.errors[0].headers["message"]


def test_temp_queue_request_reply_with_python_requestor(server, broker):
    backend, listener = client(server.port)
    backend.subscribe("/queue/orders.inbound", id="orders", ack="client-individual")
    sync(backend, listener)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                frame = listener.get(0.2)
            except queue.Empty:
                continue
            backend.send(
                frame.headers["reply-to"],
                "ack:" + frame.body,
                headers={"correlation-id": frame.headers.get("correlation-id") or frame.headers["message-id"]},
            )
            backend.ack(frame.headers["ack"])

    worker = threading.Thread(target=serve, daemon=True)
    worker.start()
    jms = broker.connect()
    jms.start()
    session = jms.create_session()
    try:
        with Requestor(session, Queue("orders.inbound")) as requestor:
            for i in range(5):
                reply = requestor.request(session.create_text_message(f"order-{i}"), timeout=5)
                body = reply.get_body().decode() if isinstance(reply, BytesMessage) else reply.text
                assert body == f"ack:order-{i}"
    finally:
        stop.set()
        worker.join(2)
        backend.disconnect()
        jms.close()


def test_temp_queue_between_stomp_clients(port):
    requester, rl = client(port)
    responder, sl = client(port)
    requester.subscribe("/temp-queue/replies", id="r")
    responder.subscribe("/queue/svc", id="s")
    sync(requester, rl)
    sync(responder, sl)
    requester.send("/queue/svc", "ping", headers={"reply-to": "/temp-queue/replies"})
    request = sl.get()
    assert request.headers["reply-to"].startswith("/temp-queue/ID:")  # rewritten for the other connection
    responder.send(request.headers["reply-to"], "pong", headers={"correlation-id": request.headers["message-id"]})
    reply = rl.get()
    assert reply.body == "pong" and reply.headers["destination"] == "/temp-queue/replies"
    requester.disconnect()
    responder.disconnect()


def test_python_responder_to_stomp_request(server, broker):
    jms = broker.connect()
    jms.start()
    session = jms.create_session()
    consumer = session.create_consumer(Queue("svc2"))
    producer = session.create_producer(None)
    conn, listener = client(server.port)
    conn.subscribe("/temp-queue/mine", id="r")
    conn.send("/queue/svc2", "q", headers={"reply-to": "/temp-queue/mine", "correlation-id": "k1"})
    request = consumer.receive(5)
    assert request.jms_reply_to.is_temporary
    reply = session.create_text_message("a")
    reply.jms_correlation_id = reply_correlation_id(request)
    producer.send(request.jms_reply_to, reply)
    frame = listener.get()
    assert frame.body == "a" and frame.headers["correlation-id"] == "k1"
    conn.disconnect()
    jms.close()


def test_browser(port):
    conn, listener = client(port)
    for i in range(3):
        conn.send("/queue/br", str(i), headers={"n": str(i)})
    sync(conn, listener)
    conn.subscribe("/queue/br", id="b", headers={"browser": "true", "selector": "n <> '1'"})
    frames = listener.take(3)
    assert [f.body for f in frames[:2]] == ["0", "2"]
    assert frames[2].headers.get("browser") == "end"
    conn.subscribe("/queue/br", id="real")
    assert len(listener.take(3)) == 3  # browsing consumed nothing
    conn.disconnect()


def test_prefetch_window_limits_unacked(port):
    conn, listener = client(port)
    for i in range(20):
        conn.send("/queue/pf", str(i))
    conn.subscribe("/queue/pf", id="p", ack="client-individual", headers={"activemq.prefetchSize": "5"})
    frames = listener.take(5)
    assert listener.none()  # the window is full
    conn.ack(frames[0].headers["ack"])
    listener.get()
    assert listener.none()
    conn.disconnect()


def test_authentication(start_server, broker, stomp_user):
    server = start_server(broker, users=[stomp_user("alice", "secret")], heartbeat=(0, 0))
    conn = stomp.Connection12([("127.0.0.1", server.port)])
    listener = Collector()
    conn.set_listener("c", listener)
    with pytest.raises(stomp.exception.StompException):
        conn.connect("alice", "wrong", wait=True)
    assert listener.errors and "authentication failed" in listener.errors[0].headers["message"]


def test_authentication_ok(start_server, broker, stomp_user):
    server = start_server(broker, users=[stomp_user("user", "pw")], heartbeat=(0, 0))
    conn, listener = client(server.port)
    sync(conn, listener)
    conn.disconnect()


def test_heartbeats_with_stomp_py(start_server, broker):
    server = start_server(broker, heartbeat=(100, 100))
    conn, listener = client(server.port, heartbeats=(100, 100))
    time.sleep(1.0)  # several heart-beat periods: the connection survives
    assert conn.is_connected() and not listener.errors
    sync(conn, listener)
    conn.disconnect()
