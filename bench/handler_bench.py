"""Handler benchmark: the sample order responder written sync and async, same run.

For each variant a Worker runs the responder (``gateway.samples.order_responder``:
``respond``, a plain function on ``--concurrency`` threads, and
``respond_async``, the same work as an ``async def`` on ``--concurrency``
tasks of the worker's event loop) against one broker, and ``--clients``
requesters send the official UBL 2.1 example Order in a closed loop (asyncio
tasks over one ``Requestor``, in this process). The variants take turns
(``--rounds`` each, ``--seconds`` a turn) so that a drift of the machine
touches both alike. Printed per variant: round trips per second, the
p50 / p99 round-trip time, and the CPU time of this process (clients,
worker and store together) per round trip, which a busy machine disturbs
less than the rates.

Usage: python bench/handler_bench.py [--url sqlite:///PATH | memory://] [--clients 16]
       [--concurrency 4] [--seconds 5] [--rounds 2]
(default URL: a SQLite file in a temporary folder, as the gateway runs.)

Not a test: the figures depend on the machine and what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_core import Broker, Queue, Requestor, XMLMessage
from gateway.handlers import Worker, handler
from gateway.samples import order_responder

REPO = Path(__file__).resolve().parents[1]
ORDER_FILE = REPO.parent / "shared" / "ubl-2.1" / "xml" / "UBL-Order-2.1-Example.xml"
QUEUE = "bench.orders"


def variants(concurrency: int) -> dict[str, object]:
    """The sample responder both ways, on the bench's queue (registered nowhere)."""
    return {
        "sync": handler(QUEUE, name="sync", concurrency=concurrency, registry=None)(order_responder.respond.function),
        "async": handler(QUEUE, name="async", concurrency=concurrency, registry=None)(
            order_responder.respond_async.function
        ),
    }


async def closed_loop(broker: Broker, order: str, clients: int, seconds: float) -> list[float]:
    """Round-trip times (s) of ``clients`` requesters sending back to back for ``seconds``."""
    conn = broker.connect()
    conn.start()
    try:
        requestor = Requestor(conn.create_session(), Queue(QUEUE))
        times: list[float] = []
        stop = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < stop:
                message = XMLMessage(order)
                message.jms_type = "Order"
                start = time.perf_counter()
                reply = await requestor.request_async(message, 30)
                times.append(time.perf_counter() - start)
                assert reply.jms_type == "OrderResponse", reply.jms_type

        await asyncio.gather(*(client() for _ in range(clients)))
        return times
    finally:
        await asyncio.to_thread(conn.close)


def run_turn(
    broker: Broker, item: object, order: str, clients: int, seconds: float
) -> tuple[int, float, float, list[float]]:
    worker = Worker(broker, [item])
    worker.start()
    try:
        asyncio.run(closed_loop(broker, order, clients, min(1.0, seconds)))  # warm up: schemas, caches
        start, cpu = time.perf_counter(), time.process_time()
        times = asyncio.run(closed_loop(broker, order, clients, seconds))
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        worker.stop()
    return len(times), elapsed, cpu, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="broker URL (default: a SQLite file in a temporary folder)")
    parser.add_argument("--clients", type=int, default=16, help="requesters in a closed loop (default 16)")
    parser.add_argument("--concurrency", type=int, default=4, help="handler sessions (default 4, as the sample)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each turn (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each variant, alternating (default 2)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    order = ORDER_FILE.read_text(encoding="utf-8")

    with tempfile.TemporaryDirectory() as folder:
        url = args.url or f"sqlite:///{folder}/bench.db"
        with Broker.open(url, sweep_interval=0) as broker:
            items = variants(args.concurrency)
            results: dict[str, list[tuple[int, float, float, list[float]]]] = {name: [] for name in items}
            for _ in range(args.rounds):
                for name, item in items.items():
                    results[name].append(run_turn(broker, item, order, args.clients, args.seconds))
            print(
                f"Python {sys.version.split()[0]}, {url.split('///')[0]}, {args.clients} clients, "
                f"concurrency {args.concurrency}, {args.rounds} x {args.seconds:g} s per variant, "
                f"{threading.active_count()} threads left"
            )
            print(
                f"{'variant':<8} {'round trips':>12} {'per second':>11} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/trip':>12}"
            )
            for name, turns in results.items():
                count = sum(t[0] for t in turns)
                elapsed = sum(t[1] for t in turns)
                cpu = sum(t[2] for t in turns)
                times = sorted(x for t in turns for x in t[3])
                p50 = statistics.median(times) * 1000
                p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000
                print(
                    f"{name:<8} {count:>12,} {count / elapsed:>11,.0f} {p50:>8.2f} {p99:>8.2f} "
                    f"{cpu / count * 1000:>12.2f}"
                )


if __name__ == "__main__":
    main()
