"""A serving process's delivery engine alone, for the crash tests: ``python delivery_worker.py URL YAML``.

Runs until killed; its in-flight deliveries come back to the next process after the store's lease.
"""

from __future__ import annotations

import sys
import time

from broker_core import Broker
from gateway.delivery.config import parse_partner_delivery
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.records import upgrade_deliveries
from gateway.marked import load_yaml

STORE_OPTIONS = dict(heartbeat_interval=0.25, lease_timeout=2.0, sweep_interval=0)


def main() -> None:
    url, config = sys.argv[1], sys.argv[2]
    broker = Broker.open(url, **STORE_OPTIONS)
    upgrade_deliveries(broker.engine)
    endpoints = parse_partner_delivery(load_yaml(config), "buyer").endpoints
    DeliveryEngine(broker, endpoints.values()).start()
    print("ready", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
