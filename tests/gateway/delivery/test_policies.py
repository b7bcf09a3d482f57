"""The engine's policies against a real receiver: the circuit breaker rests a failing endpoint, the rate
limit spaces attempts, one partner's dead endpoint does not delay another's deliveries; and the backoff's
full jitter stays within its bounds."""

from __future__ import annotations

import base64
import os
import statistics
import time

import pytest
from delivery_receiver import Receiver

from broker_core import Broker
from gateway.delivery.config import Backoff, parse_partner_delivery
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.https import retry_after_seconds
from gateway.delivery.outbox import queue_delivery
from gateway.delivery.policy import backoff_delay
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
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
    upgrade_deliveries(b.engine)
    yield b
    b.close()


def endpoint(receiver, partner: str, path: str, extra: str = "", url: str | None = None):
    text = (
        f"endpoints:\n  main:\n    url: {url or receiver.url(path)}\n    ca_bundle: {receiver.ca_file}\n"
        f"    secrets: [{SECRET}]\n    allow_addresses: [127.0.0.1]\n{extra}"
    )
    return parse_partner_delivery(load_yaml(text=text), partner).endpoints["main"]


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_the_breaker_rests_then_probes(receiver, broker):
    config = endpoint(
        receiver,
        "buyer",
        "/error",
        "    max_attempts: 100\n    backoff: {initial: 10ms, max: 10ms}\n    breaker: {failures: 3, cooldown: 2s}\n",
    )
    engine = DeliveryEngine(broker, [config])
    queue_delivery(broker, config, b"<A/>", source="test")
    engine.start()
    try:
        wait_for(lambda: len(receiver.requests["/error"]) >= 3)
        wait_for(lambda: engine.circuit_states()[("buyer", "main")] == "open")
        time.sleep(1.0)
        assert len(receiver.requests["/error"]) == 3  # resting: no attempt during the cool-down
        wait_for(lambda: len(receiver.requests["/error"]) >= 4, 30)
        time.sleep(0.5)
        assert len(receiver.requests["/error"]) == 4  # one probe, which failed: resting again
    finally:
        engine.stop()
    times = [t for _, _, t in receiver.requests["/error"]]
    assert times[3] - times[2] >= 1.9


def test_the_rate_limit_spaces_attempts(receiver, broker):
    config = endpoint(receiver, "buyer", "/ok", "    rate_limit: 5\n    concurrency: 4\n")
    ids = [queue_delivery(broker, config, f"<D>{i}</D>".encode(), source="test") for i in range(11)]
    engine = DeliveryEngine(broker, [config])
    engine.start()
    try:
        ledger = DeliveryLedger(broker.engine)
        wait_for(lambda: all(ledger.get(i, timeline=False).status == "delivered" for i in ids))
    finally:
        engine.stop()
    times = sorted(t for _, _, t in receiver.requests["/ok"])
    assert times[-1] - times[0] >= 1.0  # 11 attempts at 5/s with a burst of 5: 6 waits of 0.2 s (less jitter)


def healthy_latencies(receiver, broker, with_failing: bool) -> list[float]:
    healthy = endpoint(receiver, "seller", "/ok", "    concurrency: 2\n")
    configs = [healthy]
    if with_failing:
        # a partner whose endpoint never answers: every attempt hangs until its timeout
        configs.append(
            endpoint(
                receiver,
                "buyer",
                "/hang",
                "    timeout: 5s\n    concurrency: 8\n"
                "    backoff: {initial: 10ms, max: 20ms}\n    max_attempts: 1000\n",
            )
        )
        receiver.hang_seconds = 30.0
        for i in range(40):
            queue_delivery(broker, configs[1], f"<Stuck>{i}</Stuck>".encode(), source="test")
    engine = DeliveryEngine(broker, configs)
    engine.start()
    ledger = DeliveryLedger(broker.engine)
    try:
        time.sleep(0.5)
        latencies = []
        for i in range(30):
            start = time.time()
            delivery_id = queue_delivery(broker, healthy, f"<Ok>{i}</Ok>".encode(), source="test")
            wait_for(lambda delivery_id=delivery_id: ledger.get(delivery_id, timeline=False).status == "delivered")
            latencies.append(time.time() - start)
        return latencies
    finally:
        engine.stop(timeout=10)


def test_a_dead_partner_does_not_delay_another(receiver, broker, tmp_path):
    alone = healthy_latencies(receiver, broker, with_failing=False)
    other = Broker.open(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        upgrade_deliveries(other.engine)
        beside = healthy_latencies(receiver, other, with_failing=True)
    finally:
        other.close()
    p99_alone = sorted(alone)[-1]
    p99_beside = sorted(beside)[-1]
    print(
        f"healthy partner p99 alone {p99_alone * 1000:.0f} ms, beside a hanging one {p99_beside * 1000:.0f} ms; "
        f"medians {statistics.median(alone) * 1000:.0f} / {statistics.median(beside) * 1000:.0f} ms"
    )
    # every hanging attempt lasts 5 s: a healthy delivery that waited behind one would take that long
    assert p99_beside < 4.0
    assert len(receiver.requests["/hang"]) >= 8  # the failing partner was being attempted meanwhile


def test_full_jitter_backoff_and_retry_after():
    backoff = Backoff(initial=1.0, maximum=60.0)
    assert backoff_delay(backoff, 1, rand=lambda: 0.999) < 1.0
    assert backoff_delay(backoff, 3, rand=lambda: 0.999) == pytest.approx(4 * 0.999)
    assert backoff_delay(backoff, 30, rand=lambda: 1.0) == 60.0
    assert backoff_delay(backoff, 1, rand=lambda: 0.0) == 0.0  # full jitter reaches down to zero
    assert backoff_delay(backoff, 1, retry_after=7.0, rand=lambda: 0.5) == 7.0
    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == pytest.approx(10.0)
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    assert retry_after_seconds("99999999") == 86400.0
