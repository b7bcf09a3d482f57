"""Deliveries to a real HTTPS receiver on loopback (TLS from trustme), through the engine and the store.

Each case ends in the outcome the delivery documentation gives, with every attempt in the timeline; the
signatures are checked by the ``standardwebhooks`` package, an implementation nobody here wrote.
"""

from __future__ import annotations

import base64
import os
import time

import pytest
import standardwebhooks
from delivery_receiver import Receiver

from broker_core import Broker, Queue
from gateway.delivery.config import parse_partner_delivery
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.outbox import queue_delivery
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
from gateway.marked import load_yaml

SECRET_A = "whsec_" + base64.b64encode(os.urandom(32)).decode()
SECRET_B = "whsec_" + base64.b64encode(os.urandom(32)).decode()
DOC = b"<Invoice xmlns='urn:oasis:names:specification:ubl:schema:xsd:Invoice-2'><ID>INV-1</ID></Invoice>"


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


@pytest.fixture
def broker(tmp_path):
    b = Broker.open(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade_deliveries(b.engine)
    yield b
    b.close()


def endpoints(receiver, paths: dict[str, str], extra: str = "", secrets: str = "") -> dict:
    text = "endpoints:\n"
    for name, path in paths.items():
        text += (
            f"  {name}:\n    url: {receiver.url(path)}\n    ca_bundle: {receiver.ca_file}\n"
            f"    secrets: [{secrets or SECRET_A}]\n    allow_addresses: [127.0.0.1/32]\n"
            f"    timeout: 1s\n    max_attempts: 4\n    backoff: {{initial: 50ms, max: 200ms}}\n{extra}"
        )
    return parse_partner_delivery(load_yaml(text=text), "buyer").endpoints


def wait_settled(ledger: DeliveryLedger, ids: list[str], timeout: float = 60.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [ledger.get(i) for i in ids]
        if all(r is not None and r.status != "pending" for r in rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"not settled in {timeout} s: {[(r.message_id, r.status, r.attempts) for r in rows if r]}")


def run(broker, configs: dict, sends: list[tuple[str, bytes]], timeout: float = 60.0) -> list:
    engine = DeliveryEngine(broker, configs.values())
    ids = [queue_delivery(broker, configs[name], body, source="test") for name, body in sends]
    engine.start()
    try:
        return wait_settled(DeliveryLedger(broker.engine), ids, timeout)
    finally:
        engine.stop()


def test_success_is_signed_the_standard_webhooks_way(receiver, broker):
    configs = endpoints(receiver, {"main": "/ok"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered" and row.attempts == 1
    assert [(a.attempt, a.outcome, a.status) for a in row.timeline] == [(1, "delivered", 204)]
    [(headers, body, _)] = receiver.requests["/ok"]
    assert body == DOC and headers["content-type"] == "application/xml"
    assert headers["webhook-id"] == row.message_id
    standardwebhooks.Webhook(SECRET_A).verify(body, headers, json_parse=False)  # raises on a bad signature
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET_B).verify(body, headers, json_parse=False)


def test_two_secrets_during_rotation_each_verify(receiver, broker):
    configs = endpoints(receiver, {"main": "/ok"}, secrets=f"{SECRET_A}, {SECRET_B}")
    run(broker, configs, [("main", DOC)])
    [(headers, body, _)] = receiver.requests["/ok"]
    assert len(headers["webhook-signature"].split()) == 2
    standardwebhooks.Webhook(SECRET_A).verify(body, headers, json_parse=False)
    standardwebhooks.Webhook(SECRET_B).verify(body, headers, json_parse=False)


def test_failures_then_success_keep_one_webhook_id(receiver, broker):
    receiver.fail_first = 2
    configs = endpoints(receiver, {"main": "/flaky"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered"
    assert [(a.outcome, a.status) for a in row.timeline] == [("retry", 503), ("retry", 503), ("delivered", 200)]
    ids = {h["webhook-id"] for h, _, _ in receiver.requests["/flaky"]}
    assert ids == {row.message_id}


def test_429_waits_at_least_retry_after(receiver, broker):
    configs = endpoints(receiver, {"main": "/throttle"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered" and [a.status for a in row.timeline] == [429, 200]
    (_, _, first), (_, _, second) = receiver.requests["/throttle"]
    assert second - first >= 1.9  # Retry-After: 2, although the backoff alone is at most 200 ms


def test_500_until_max_attempts_is_dead_with_the_last_answer(receiver, broker):
    configs = endpoints(receiver, {"main": "/error"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "dead" and row.attempts == 4
    assert [a.status for a in row.timeline] == [500] * 4
    assert row.last_status == 500 and "internal error" in row.last_detail
    deadline = time.monotonic() + 30  # the ledger says dead just before the message moves
    while not list(broker.browse(Queue(configs["main"].dead_queue))) and time.monotonic() < deadline:
        time.sleep(0.05)
    dead = broker.browse(Queue(configs["main"].dead_queue))
    assert [m.jms_message_id for m in dead] == [row.message_id]


def test_4xx_is_permanent_at_once(receiver, broker):
    configs = endpoints(receiver, {"main": "/refuse"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "dead" and [(a.outcome, a.status) for a in row.timeline] == [("failed", 400)]


def test_hang_past_the_timeout_is_retried(receiver, broker):
    receiver.hang_seconds = 3.0
    configs = endpoints(receiver, {"main": "/hang"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered"
    first, second = row.timeline
    assert first.outcome == "retry" and first.status is None and "no answer within 1 s" in first.detail
    assert first.duration_ms < 2500 and second.status == 200


def test_connection_closed_mid_response_is_retried(receiver, broker):
    configs = endpoints(receiver, {"main": "/cut"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered"
    assert [a.outcome for a in row.timeline] == ["retry", "delivered"]
    assert row.timeline[0].status is None


def test_redirect_is_not_followed(receiver, broker):
    configs = endpoints(receiver, {"main": "/redirect"})
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "dead" and [(a.outcome, a.status) for a in row.timeline] == [("failed", 302)]
    assert "not followed" in row.last_detail


def test_same_origin_redirect_is_followed_when_configured(receiver, broker):
    configs = endpoints(receiver, {"main": "/redirect-same"}, extra="    redirects: same-origin\n")
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered"
    [(headers, body, _)] = receiver.requests["/ok-after-redirect"]
    assert body == DOC
    standardwebhooks.Webhook(SECRET_A).verify(body, headers, json_parse=False)


def test_a_10_mb_answer_is_read_only_up_to_the_limit(receiver, broker):
    configs = endpoints(receiver, {"main": "/big"}, extra="    max_response_bytes: 1024\n")
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "delivered" and [a.status for a in row.timeline] == [200]
    assert row.timeline[0].duration_ms < 5000
    assert len(row.last_detail) < 400


def test_loopback_is_refused_unless_allowed(receiver, broker):
    text = (
        f"endpoints:\n  main:\n    url: {receiver.url('/ok')}\n    ca_bundle: {receiver.ca_file}\n"
        f"    secrets: [{SECRET_A}]\n    max_attempts: 3\n"
    )
    configs = parse_partner_delivery(load_yaml(text=text), "buyer").endpoints
    [row] = run(broker, configs, [("main", DOC)])
    assert row.status == "dead" and row.timeline[0].outcome == "failed"
    assert "allow_addresses" in row.last_detail
    assert receiver.requests["/ok"] == []


def test_in_order_with_one_worker(receiver, broker):
    receiver.fail_first = 1
    configs = endpoints(receiver, {"main": "/flaky"})
    docs = [f"<Doc><ID>{i}</ID></Doc>".encode() for i in range(6)]
    run(broker, configs, [("main", d) for d in docs])
    bodies = [b for _, b, _ in receiver.requests["/flaky"]]
    assert bodies == [docs[0], *docs]  # the first retried in place; the rest after it, in order


def test_a_backlog_is_delivered_once_each_and_acknowledged(receiver, broker):
    configs = endpoints(receiver, {"main": "/ok"}, extra="    concurrency: 4\n")
    docs = [f"<Doc><ID>{i}</ID></Doc>".encode() for i in range(120)]
    rows = run(broker, configs, [("main", d) for d in docs])
    assert all(r.status == "delivered" and [a.outcome for a in r.timeline] == ["delivered"] for r in rows)
    received = [h["webhook-id"] for h, _, _ in receiver.requests["/ok"]]
    assert sorted(received) == sorted(r.message_id for r in rows)  # each once: nothing sent twice
    assert broker.stats(Queue(configs["main"].queue)).depth == 0  # every message acknowledged
