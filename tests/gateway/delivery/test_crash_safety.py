"""``kill -9`` of the delivering process during a burst to a slow receiver, then a restart: every document
delivered at least once, none lost, and a duplicate carries the same ``webhook-id``. On PostgreSQL, two
processes deliver at once and one of them is killed."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from delivery_receiver import Receiver

from broker_core import Broker
from gateway.delivery.config import parse_partner_delivery
from gateway.delivery.outbox import queue_delivery
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
from gateway.marked import load_yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
COUNT = 60


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


def start(url: str, config: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE)])}
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "delivery_worker.py"), url, str(config)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def wait_for(predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def burst_then_kill(url: str, receiver: Receiver, tmp_path: Path, processes: int) -> None:
    config = tmp_path / "endpoints.yaml"
    config.write_text(
        f"endpoints:\n  main:\n    url: {receiver.url('/slow')}\n    ca_bundle: {receiver.ca_file}\n"
        f"    secrets: [{SECRET}]\n    allow_addresses: [127.0.0.1]\n    concurrency: 4\n"
        "    timeout: 10s\n    backoff: {initial: 100ms, max: 500ms}\n"
    )
    endpoint = parse_partner_delivery(load_yaml(config), "buyer").endpoints["main"]
    broker = Broker.open(url, sweep_interval=0)
    try:
        upgrade_deliveries(broker.engine)
        expected = {}
        for i in range(COUNT):
            body = f"<Invoice><ID>CRASH-{i}</ID></Invoice>".encode()
            expected[queue_delivery(broker, endpoint, body, source="test")] = body
        procs = [start(url, config) for _ in range(processes)]
        try:
            wait_for(lambda: len(receiver.requests["/slow"]) >= 10)
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            procs[0] = start(url, config)
            ledger = DeliveryLedger(broker.engine)
            wait_for(lambda: all(ledger.get(i, timeline=False).status == "delivered" for i in expected), 180)
        finally:
            for p in procs:
                p.kill()
                p.wait(10)
        seen: dict[str, set[bytes]] = defaultdict(set)
        for headers, body, _ in receiver.requests["/slow"]:
            seen[headers["webhook-id"]].add(body)
        assert set(seen) == set(expected)  # every delivery arrived, and nothing else did
        for delivery_id, bodies in seen.items():
            assert bodies == {expected[delivery_id]}  # a duplicate is the same document under the same id
    finally:
        broker.close()


def test_kill_9_during_a_burst_loses_nothing_sqlite(receiver, tmp_path):
    burst_then_kill(f"sqlite:///{tmp_path / 'store.db'}", receiver, tmp_path, processes=1)


@pytest.mark.postgres
def test_kill_9_of_one_of_two_processes_loses_nothing_postgres(receiver, tmp_path, postgres_schema):
    burst_then_kill(postgres_schema, receiver, tmp_path, processes=2)
