"""Dead deliveries replayed and discarded by an operator (audited), and endpoints' configuration checks."""

from __future__ import annotations

import base64
import os
import time

import pytest
import sqlalchemy as sa
from delivery_receiver import Receiver

from broker_core import Broker, Queue
from gateway.admin import deliveries_ops as operations
from gateway.delivery.config import parse_partner_delivery
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.outbox import queue_delivery
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
from gateway.errors import ConfigError
from gateway.ledger.records import upgrade_ledger
from gateway.marked import load_yaml

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


@pytest.fixture
def broker(tmp_path):
    b = Broker.open(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade_ledger(b.engine)
    upgrade_deliveries(b.engine)
    yield b
    b.close()


def wait_status(ledger, message_id, status, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = ledger.get(message_id)
        if row is not None and row.status == status:
            return row
        time.sleep(0.05)
    raise AssertionError(f"{message_id} is not {status}: {ledger.get(message_id)}")


def test_replay_sends_a_dead_delivery_again_and_discard_drops_it(receiver, broker):
    text = (
        f"endpoints:\n  main:\n    url: {receiver.url('/flaky')}\n    ca_bundle: {receiver.ca_file}\n"
        f"    secrets: [{SECRET}]\n    allow_addresses: [127.0.0.1]\n    max_attempts: 2\n"
        "    backoff: {initial: 10ms, max: 20ms}\n"
    )
    endpoint = parse_partner_delivery(load_yaml(text=text), "buyer").endpoints["main"]
    receiver.fail_first = 1000
    ledger = DeliveryLedger(broker.engine)
    engine = DeliveryEngine(broker, [endpoint])
    engine.start()
    try:
        first = queue_delivery(broker, endpoint, b"<A/>", source="test")
        second = queue_delivery(broker, endpoint, b"<B/>", source="test")
        wait_status(ledger, first, "dead")
        wait_status(ledger, second, "dead")
        deadline = time.monotonic() + 30  # the ledger says dead just before the message moves
        while len(list(broker.browse(Queue(endpoint.dead_queue)))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        receiver.fail_first = 0
        assert operations.replay(broker, endpoint, [first], operator="alice") == [first]
        row = wait_status(ledger, first, "delivered")
        assert [a.attempt for a in row.timeline] == [1, 2, 1]  # the replay counts its attempts afresh
        assert operations.discard(broker, endpoint, None, operator="alice") == [second]
        assert ledger.get(second).status == "discarded"
        assert list(broker.browse(Queue(endpoint.dead_queue))) == []
    finally:
        engine.stop()
    webhook_ids = [h["webhook-id"] for h, _, _ in receiver.requests["/flaky"]]
    assert webhook_ids.count(first) == 3 and webhook_ids.count(second) == 2
    with broker.engine.connect() as conn:
        audit = conn.execute(sa.text("SELECT operator, action, target, count FROM b2b_audit ORDER BY id")).all()
    assert [tuple(r) for r in audit] == [
        ("alice", "delivery-replay", "buyer/main", 1),
        ("alice", "delivery-discard", "buyer/main", 1),
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ("  main: {url: 'http://x.example/hook', secrets: [SECRET]}", "must be an https:// URL"),
        ("  main: {url: 'https://x.example/hook'}", "secrets must list at least one"),
        ("  main: {url: 'https://x.example/hook', secrets: [whsec_short]}", "whsec_"),
        ("  main: {kind: ftp, url: 'https://x.example/hook', secrets: [SECRET]}", "kind 'ftp' is not known"),
        ("  main: {url: 'https://x.example/hook', secrets: [SECRET], concurrency: 0}", "concurrency must be"),
        ("  main: {url: 'https://x.example/hook', secrets: [SECRET], allow_addresses: [nowhere]}", "CIDR"),
        ("  main: {url: 'https://x.example/hook', secrets: [SECRET], headers: {webhook-id: x}}", "set by the gateway"),
        ("  main: {url: 'https://x.example/hook', secrets: [SECRET], colour: red}", "unknown key 'colour'"),
    ],
)
def test_endpoint_mistakes_are_refused_with_their_line(body, message):
    text = "endpoints:\n" + body.replace("SECRET", SECRET) + "\n"
    with pytest.raises(ConfigError) as caught:
        parse_partner_delivery(load_yaml(text=text, name="partners.yaml"), "buyer")
    assert message in caught.value.detail
    assert caught.value.file == "partners.yaml" and caught.value.line == 2


def test_notify_must_name_one_of_its_endpoints():
    text = (
        f"endpoints:\n  main: {{url: 'https://x.example/hook', secrets: [{SECRET}]}}\nnotify:\n  late_replies: other\n"
    )
    with pytest.raises(ConfigError, match="not among its endpoints"):
        parse_partner_delivery(load_yaml(text=text), "buyer")
