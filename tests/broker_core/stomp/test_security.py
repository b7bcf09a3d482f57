"""The STOMP listener's access control against the attacks it must stop, over
real sockets and with stomp.py: who may log in, consume, browse and send,
temporary destinations, JMSXUserID and client ids."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest
import stomp

from broker_core import Broker, Queue, Requestor, TextMessage, Topic
from broker_core.stomp import NoUsersError, StompServer

sys.path.insert(0, os.path.dirname(__file__))  # the raw-socket and stomp.py helpers of the neighbouring tests
from test_interop import Collector
from test_server import Raw, expect_error

BACKEND = dict(consume=["/queue/orders.inbound"], send=["/queue/orders.replies"])
INTRUDER = dict(consume=["/queue/public.*"], send=["/queue/public.>"])
OPERATOR = dict(browse=["/queue/DLQ.>"])


@pytest.fixture
def users(stomp_user) -> list[Any]:
    return [
        stomp_user("backend", "b-pass", **BACKEND),
        stomp_user("intruder", "i-pass", **INTRUDER),
        stomp_user("operator", "o-pass", **OPERATOR),
    ]


@pytest.fixture
def srv(start_server, broker, users) -> Any:
    return start_server(broker, users=users, heartbeat=(0, 0))


def login(port: int, user: str, passcode: str, **headers: Any) -> Raw:
    raw = Raw(port)
    raw.connect(login=user, passcode=passcode, **headers)
    return raw


def stomp_py(port: int, user: str, passcode: str, **headers: Any) -> tuple[Any, Collector]:
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    listener = Collector()
    conn.set_listener("c", listener)
    conn.connect(user, passcode, wait=True, headers=headers)
    return conn, listener


def put(broker: Broker, queue: str, text: str, **props: Any) -> None:
    with broker.connect() as conn:
        message = TextMessage(text)
        for name, value in props.items():
            message.set_string_property(name, value)
        conn.create_session().create_producer(Queue(queue)).send(message)


def depth(broker: Broker, queue: str) -> int:
    return broker.stats(f"queue://{queue}").depth


def test_a_listener_without_users_is_never_started(broker):
    with pytest.raises(NoUsersError, match="at least one user"):
        StompServer(broker, port=0)
    with pytest.raises(NoUsersError):
        StompServer(broker, port=0, users=[])


@pytest.mark.parametrize(
    "headers",
    [{}, {"login": "backend"}, {"login": "backend", "passcode": "wrong"}, {"login": "nobody", "passcode": "b-pass"}],
)
def test_connect_needs_a_configured_login_and_its_passcode(srv, headers):
    raw = Raw(srv.port)
    raw.frame("CONNECT", accept_version="1.2", host="x", **headers)
    frame = raw.next()
    assert frame.command == "ERROR" and frame.headers["message"] in (
        "authentication failed",
        "authentication throttled",
    )
    assert raw.closed_by_server()


def test_stomp_py_is_refused_with_a_wrong_passcode(srv):
    conn = stomp.Connection12([("127.0.0.1", srv.port)], heartbeats=(0, 0))
    listener = Collector()
    conn.set_listener("c", listener)
    with pytest.raises(stomp.exception.StompException):
        conn.connect("backend", "guess", wait=True)
    assert listener.errors and listener.errors[0].headers["message"] == "authentication failed"


def test_failed_logins_are_throttled_before_any_passcode_check(srv):
    authenticator = srv.server.settings.authenticator
    raw = Raw(srv.port)
    raw.frame("CONNECT", accept_version="1.2", login="backend", passcode="guess-1")
    expect_error(raw, "authentication failed")
    checks = authenticator.checks
    for attempt in range(20):  # refused at once: no scrypt, even for the right passcode
        raw = Raw(srv.port)
        raw.frame("CONNECT", accept_version="1.2", login="backend", passcode="b-pass" if attempt == 19 else "guess")
        frame = expect_error(raw, "authentication throttled")
        assert b"try again in" in frame.body
    assert authenticator.checks == checks
    time.sleep(1.2)  # the first failure's wait is over
    login(srv.port, "backend", "b-pass").close()


def test_a_verified_passcode_is_not_hashed_again(srv):
    login(srv.port, "backend", "b-pass").close()
    checks = srv.server.settings.authenticator.checks
    for _ in range(5):
        login(srv.port, "backend", "b-pass").close()
    assert srv.server.settings.authenticator.checks == checks


def test_a_user_cannot_take_orders_it_has_no_right_to_consume(srv, broker):
    put(broker, "orders.inbound", "<Order/>")
    raw = login(srv.port, "intruder", "i-pass")
    raw.frame("SUBSCRIBE", destination="/queue/orders.inbound", id="steal", ack="auto")
    frame = expect_error(raw, "not authorised")
    assert b"stomp.users.intruder.consume" in frame.body
    assert depth(broker, "orders.inbound") == 1  # still there for the responder
    conn, listener = stomp_py(srv.port, "backend", "b-pass")
    conn.subscribe("/queue/orders.inbound", id="mine")
    assert listener.get().body == "<Order/>"
    conn.disconnect()


def test_stomp_py_subscription_without_the_right_gets_an_error(srv, broker):
    put(broker, "orders.inbound", "<Order/>")
    conn, listener = stomp_py(srv.port, "intruder", "i-pass")
    conn.subscribe("/queue/orders.inbound", id="x")
    deadline = time.monotonic() + 5
    while not listener.errors and time.monotonic() < deadline:
        time.sleep(0.05)
    assert listener.errors and listener.errors[0].headers["message"] == "not authorised"
    assert listener.none() and depth(broker, "orders.inbound") == 1


def test_send_needs_the_right_and_so_does_naming_a_destination_in_reply_to(srv, broker):
    raw = login(srv.port, "intruder", "i-pass")
    raw.frame("SEND", b"<OrderResponse/>", destination="/queue/orders.replies")
    expect_error(raw, "not authorised")
    raw = login(srv.port, "intruder", "i-pass")
    raw.frame("SEND", b"x", destination="/queue/public.a", **{"reply-to": "/queue/orders.replies"})
    expect_error(raw, "not authorised")
    assert depth(broker, "orders.replies") == 0 and depth(broker, "public.a") == 0


def test_dead_letters_are_browsed_only_with_the_right(srv, broker):
    put(broker, "DLQ.orders.inbound", "<Order>partner data</Order>")
    raw = login(srv.port, "intruder", "i-pass")
    raw.frame("SUBSCRIBE", destination="/queue/DLQ.orders.inbound", id="b", browser="true")
    expect_error(raw, "not authorised")
    raw = login(srv.port, "operator", "o-pass")
    raw.frame("SUBSCRIBE", destination="/queue/DLQ.orders.inbound", id="b", browser="true")
    assert raw.next().body == b"<Order>partner data</Order>"
    assert raw.next().headers.get("browser") == "end"
    raw.frame("SUBSCRIBE", destination="/queue/DLQ.orders.inbound", id="take")  # browsing is not consuming
    expect_error(raw, "not authorised")
    assert depth(broker, "DLQ.orders.inbound") == 1


def _gateway_like_request(broker: Broker, results: dict[str, Any]) -> Any:
    """A request as the gateway sends it (reply-to: its temporary queue), answered through STOMP."""
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    requestor = Requestor(session, Queue("orders.inbound"))
    message = TextMessage("<Order/>")
    message.jms_correlation_id = "order-42"

    def ask() -> None:
        results["reply"] = requestor.request(message, timeout=10)

    return conn, requestor, ask


def test_forged_replies_to_the_gateways_temporary_queue_are_refused(srv, broker):
    import threading

    results: dict[str, Any] = {}
    conn, requestor, ask = _gateway_like_request(broker, results)
    thread = threading.Thread(target=ask)
    thread.start()
    try:
        backend, listener = stomp_py(srv.port, "backend", "b-pass")
        backend.subscribe("/queue/orders.inbound", id="o", ack="client-individual")
        request = listener.get()
        reply_to = request.headers["reply-to"]
        assert reply_to.startswith("/temp-queue/")
        # someone who never received the request: refused, whatever correlation id it names
        raw = login(srv.port, "intruder", "i-pass")
        raw.frame(
            "SEND", b"<OrderResponse>forged</OrderResponse>", destination=reply_to, **{"correlation-id": "order-42"}
        )
        expect_error(raw, "not authorised")
        # the backend that consumed it may reply, only with the correlation id the request asks for
        raw = login(srv.port, "backend", "b-pass")
        raw.frame(
            "SEND", b"<OrderResponse>other</OrderResponse>", destination=reply_to, **{"correlation-id": "order-41"}
        )
        expect_error(raw, "not authorised")
        backend.send(reply_to, "<OrderResponse>real</OrderResponse>", headers={"correlation-id": "order-42"})
        backend.ack(request.headers["ack"])
        thread.join(10)
        assert results["reply"].get_body() == b"<OrderResponse>real</OrderResponse>"  # stomp.py adds content-length
        assert results["reply"].get_string_property("JMSXUserID") == "backend"
        backend.disconnect()
    finally:
        thread.join(10)
        requestor.close()
        conn.close()


def test_another_connections_temporary_queue_is_not_consumed_nor_named_in_reply_to(srv, broker):
    owner = login(srv.port, "intruder", "i-pass")
    owner.frame("SUBSCRIBE", destination="/temp-queue/mine", id="t")
    owner.frame("SEND", b"ping", destination="/queue/public.svc", receipt="r", **{"reply-to": "/temp-queue/mine"})
    assert owner.next().command == "RECEIPT"
    taker = login(srv.port, "intruder", "i-pass")
    taker.frame("SUBSCRIBE", destination="/queue/public.svc", id="s")
    real_name = taker.next().headers["reply-to"]  # /temp-queue/ID:... as other connections see it
    for attempt in ("consume", "reply-to", "browse"):
        other = login(srv.port, "backend", "b-pass")
        if attempt == "consume":
            other.frame("SUBSCRIBE", destination=real_name, id="x")
        elif attempt == "browse":
            other.frame("SUBSCRIBE", destination=real_name, id="x", browser="true")
        else:  # the confused deputy: a request whose replies would go to someone else's temporary queue
            other.frame("SEND", b"x", destination="/queue/orders.replies", **{"reply-to": real_name})
        expect_error(other, "not authorised")


def test_jmsxuserid_is_always_the_authenticated_login(srv, broker):
    conn, _ = stomp_py(srv.port, "backend", "b-pass")
    conn.send("/queue/orders.replies", "x", headers={"JMSXUserID": "acme", "receipt": "r"})
    time.sleep(0.3)
    conn.disconnect()
    with broker.connect() as jms:
        jms.start()
        message = jms.create_session().create_consumer(Queue("orders.replies")).receive(timeout=5)
    assert message is not None and message.get_string_property("JMSXUserID") == "backend"


def test_a_client_id_belongs_to_one_user(start_server, broker, stomp_user):
    users = [
        stomp_user("erp", "e-pass", consume=["/topic/prices"]),
        stomp_user("intruder", "i-pass", consume=["/topic/prices"], client_ids=["erp", "erp.*", "intruder"]),
    ]
    srv = start_server(broker, users=users, heartbeat=(0, 0))
    erp = login(srv.port, "erp", "e-pass", **{"client-id": "erp.1"})
    erp.frame("SUBSCRIBE", destination="/topic/prices", id="d", **{"durable-subscription-name": "prices"}, receipt="r")
    assert erp.next().command == "RECEIPT"
    erp.frame("DISCONNECT", receipt="bye")
    assert erp.next().command == "RECEIPT"
    raw = Raw(srv.port)  # another user, even one whose own patterns match the id
    raw.frame("CONNECT", accept_version="1.2", login="intruder", passcode="i-pass", **{"client-id": "erp.1"})
    expect_error(raw, "client-id not allowed")
    raw = Raw(srv.port)  # the default: a user's own login and LOGIN.* only
    raw.frame("CONNECT", accept_version="1.2", login="erp", passcode="e-pass", **{"client-id": "intruder"})
    expect_error(raw, "client-id not allowed")
    erp = login(srv.port, "erp", "e-pass", **{"client-id": "erp.1"})
    erp.frame("SUBSCRIBE", destination="/topic/prices", id="d", **{"durable-subscription-name": "prices"})
    with broker.connect() as jms:
        jms.create_session().create_producer(Topic("prices")).send(TextMessage("42"))
    assert erp.next().body == b"42"


def test_the_listener_runs_its_checks_without_the_gateway():
    """python -m broker_core.stomp refuses to start without --user."""
    from broker_core.stomp.__main__ import main

    with pytest.raises(SystemExit, match="--user"):
        main(["--port", "0"])
    with pytest.raises(SystemExit, match="LOGIN:HASH"):
        main(["--port", "0", "--user", "alice:plain-secret"])
