"""Benchmark of outbound delivery to a local HTTPS receiver. Prints, in one run:

1. deliveries per second with 1 endpoint and with 16 endpoints (``concurrency: 8`` each): N deliveries
   queued first, then the engine drains them; the engine's CPU time per delivery (this process, which
   runs nothing else meanwhile);
2. commit-to-receipt latency, p50 / p99: deliveries queued one commit each at a steady ``--rate`` to one
   endpoint while the engine runs, timed from the commit that queued each to its arrival at the receiver;
3. the gateway's inbound one-way rate (``b2bgw serve``, UBL Orders on a one-way route, closed loop of
   ``--connections`` clients) without deliveries, then with the route delivering every order it accepts
   to the receiver (the engine running in the serving process). Goal: within 10%.

Goal of (1): at least 1,000 deliveries/s with one endpoint and ``concurrency: 8``.

Usage::

    .venv/bin/python bench/delivery_bench.py [--deliveries 3000] [--seconds 10] [--rate 200] [--connections 32]
        [--only 1|2|3]

The receiver is uvicorn in a subprocess with a certificate from trustme; the store is SQLite
(``synchronous=FULL``) in a temporary folder. Everything talks to 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import trustme
import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

from gateway_bench import ServerProcess, closed_loop, free_port, order_with_id, write_config  # noqa: E402

from broker_core import Broker, DeliveryMode, Queue  # noqa: E402
from gateway.delivery.config import parse_partner_delivery  # noqa: E402
from gateway.delivery.engine import DeliveryEngine  # noqa: E402
from gateway.delivery.outbox import delivery_message, queue_delivery  # noqa: E402
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries  # noqa: E402
from gateway.marked import load_yaml  # noqa: E402
from gateway.routing.partners import generate_key  # noqa: E402

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
DOC = (
    b"<Invoice xmlns='urn:oasis:names:specification:ubl:schema:xsd:Invoice-2'><ID>1</ID>" + b"x" * 1000 + b"</Invoice>"
)


class Receiver:
    def __init__(self, folder: Path) -> None:
        ca = trustme.CA()
        cert = ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
        ca.cert_pem.write_to_path(str(self.ca_file))
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        self.out = folder / f"arrivals-{uuid.uuid4().hex[:6]}.jsonl"
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(BENCH / "delivery_receiver_app.py"),
                str(self.port),
                str(cert_file),
                str(key_file),
                str(self.out),
            ]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.post(f"https://127.0.0.1:{self.port}/", verify=str(self.ca_file), timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError("the receiver did not start")

    def endpoint_yaml(self, name: str) -> dict:
        return {
            "url": f"https://127.0.0.1:{self.port}/{name}",
            "ca_bundle": str(self.ca_file),
            "secrets": [SECRET],
            "allow_addresses": ["127.0.0.1"],
            "concurrency": 8,
        }

    def arrivals(self) -> dict[str, float]:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        out: dict[str, float] = {}
        for line in self.out.read_text().splitlines():
            delivery_id, at = json.loads(line)
            out.setdefault(delivery_id, at)
        return out


def endpoints(receiver: Receiver, count: int) -> list:
    section = {"endpoints": {f"e{i}": receiver.endpoint_yaml(f"e{i}") for i in range(count)}}
    marked = load_yaml(text=yaml.safe_dump(section))
    return list(parse_partner_delivery(marked, "bench").endpoints.values())


def queue_many(broker: Broker, configs: list, count: int) -> list[str]:
    """Queue *count* deliveries round-robin over *configs*, 200 per commit."""
    ids = []
    with broker.connect() as connection:
        session = connection.create_session(transacted=True)
        producer = session.create_producer(None)
        for start in range(0, count, 200):
            inserts = []
            for i in range(start, min(count, start + 200)):
                config = configs[i % len(configs)]
                message = delivery_message(config, DOC, "application/xml", "bench")
                producer.send(Queue(config.queue), message, delivery_mode=DeliveryMode.PERSISTENT)
                ids.append(message.jms_message_id)
                inserts.append(
                    DeliveryLedger.insert(
                        message.jms_message_id,
                        config.partner,
                        config.name,
                        config.kind,
                        "bench",
                        "Invoice",
                        "application/xml",
                        DOC,
                    )
                )
            session.commit(in_transaction=inserts)
    return ids


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def drain(folder: Path, count: int, n_endpoints: int) -> dict[str, float]:
    receiver = Receiver(folder)
    broker = Broker.open(f"sqlite:///{folder / f'drain-{n_endpoints}.db'}", sweep_interval=0)
    try:
        upgrade_deliveries(broker.engine)
        configs = endpoints(receiver, n_endpoints)
        ids = queue_many(broker, configs, count)
        engine = DeliveryEngine(broker, configs)
        cpu0, t0 = cpu(), time.time()
        engine.start()
        ledger = DeliveryLedger(broker.engine)
        while sum(s.delivered for s in ledger.summary()) < count:
            time.sleep(0.1)
        elapsed, used = time.time() - t0, cpu() - cpu0
        engine.stop()
    finally:
        broker.close()
    arrivals = receiver.arrivals()
    last = max(arrivals[i] for i in ids)
    return {
        "rate": count / (last - t0),
        "elapsed": elapsed,
        "cpu_ms": used / count * 1000,
        "duplicates": 0.0,
        "received": float(len(arrivals)),
    }


def latency(folder: Path, seconds: float, rate: float) -> dict[str, float]:
    receiver = Receiver(folder)
    broker = Broker.open(f"sqlite:///{folder / 'latency.db'}", sweep_interval=0)
    committed: dict[str, float] = {}
    try:
        upgrade_deliveries(broker.engine)
        [config] = endpoints(receiver, 1)
        engine = DeliveryEngine(broker, [config])
        engine.start()
        deadline = time.time() + seconds
        interval = 1.0 / rate
        next_at = time.time()
        while time.time() < deadline:
            delivery_id = queue_delivery(broker, config, DOC, source="bench")
            committed[delivery_id] = time.time()
            next_at += interval
            time.sleep(max(0.0, next_at - time.time()))
        ledger = DeliveryLedger(broker.engine)
        end = time.time() + 60
        while time.time() < end and sum(s.delivered for s in ledger.summary()) < len(committed):
            time.sleep(0.1)
        engine.stop()
    finally:
        broker.close()
    arrivals = receiver.arrivals()
    lat = sorted(arrivals[i] - t for i, t in committed.items() if i in arrivals)
    return {
        "count": float(len(lat)),
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
    }


def inbound(folder: Path, seconds: float, connections: int, deliver: bool) -> dict[str, float]:
    bench_key = generate_key("bench")
    sub = folder / ("with" if deliver else "without")
    sub.mkdir()
    config_path = write_config(sub, bench_key, rules=False)
    receiver = Receiver(sub) if deliver else None
    if receiver is not None:
        config = yaml.safe_load(config_path.read_text())
        config["partners"]["acme"]["endpoints"] = {"main": receiver.endpoint_yaml("main")}
        route = next(r for r in config["routes"] if r["id"] == "bench-order-one-way")
        route["deliver"] = {"partner": "acme", "endpoint": "main"}
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    server = ServerProcess(config_path, port, sub / "server.log")
    try:
        server.wait_ready()
        headers = {"Authorization": f"Bearer {bench_key}", "Content-Type": "application/xml"}
        for i in range(50):
            httpx.post(
                f"http://127.0.0.1:{port}/v1/documents", content=order_with_id(f"warm-{i}"), headers=headers, timeout=30
            )
        run = uuid.uuid4().hex[:8]
        result = asyncio.run(
            closed_loop(
                f"http://127.0.0.1:{port}/v1/documents",
                headers,
                seconds,
                connections,
                lambda n: order_with_id(f"{run}-{n}"),
                202,
            )
        )
    finally:
        server.stop()
    if receiver is not None:
        result["delivered_during_run"] = float(len(receiver.arrivals()))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=3000, help="deliveries drained in (1), per run")
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of (2) and of each run of (3)")
    parser.add_argument("--rate", type=float, default=200.0, help="deliveries queued per second in (2)")
    parser.add_argument("--connections", type=int, default=32, help="clients of (3)")
    parser.add_argument("--only", choices=("1", "2", "3"), help="run only this part (part 1: one endpoint only)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="b2bgw-delivery-bench-"))
    print(
        f"b2bgw delivery benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    if args.only in (None, "1"):
        for n in (1,) if args.only else (1, 16):
            r = drain(folder, args.deliveries, n)
            print(
                f"1. {n:2d} endpoint(s), concurrency 8: {r['rate']:.0f} deliveries/s ({args.deliveries} in "
                f"{r['elapsed']:.1f} s), engine CPU {r['cpu_ms']:.2f} ms per delivery",
                flush=True,
            )
    if args.only in (None, "2"):
        r = latency(folder, args.seconds, args.rate)
        print(
            f"2. commit to receipt at {args.rate:g}/s: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms "
            f"({r['count']:.0f} deliveries)",
            flush=True,
        )
    if args.only in (None, "3"):
        without = inbound(folder, args.seconds, args.connections, deliver=False)
        print(f"3. inbound one-way without deliveries: {without['rate']:.0f} orders/s", flush=True)
        with_ = inbound(folder, args.seconds, args.connections, deliver=True)
        print(
            f"   inbound one-way with each order delivered: {with_['rate']:.0f} orders/s "
            f"({with_['rate'] / without['rate'] * 100:.0f}% of without; {with_['delivered_during_run']:.0f} "
            "delivered by the end)",
            flush=True,
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
