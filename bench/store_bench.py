"""SQL store benchmark: persistent delivery on SQLite and PostgreSQL.

Prints, in one run, for each database:
  * the raw batched-insert limit (plain sqlite3 / psycopg, 100 rows of 2 KB
    per commit, same durability settings), measured now;
  * persistent send + receive + acknowledge throughput for 2 KB messages
    with 1 and 4 producers: threads calling send() (each send waits for its
    commit) and asyncio producers calling send_async() with 64 sends in
    flight each (JMS 2.0 asynchronous send); two consumer threads in AUTO
    mode receive everything; and the ratio to the raw limit;
  * the same with the work spread over processes, as several gateway
    processes sharing one store would: 1 or 4 producer processes (send_async,
    64 in flight each) and one consumer process (two threads, AUTO), and 4
    producers in one process with the consumer in another (a gateway process
    and a worker process: ``b2bgw serve`` and ``b2bgw worker``); with the
    CPU time all processes spent per message (steadier than rates on a
    shared machine);
  * single persistent send latency p50/p99 (one producer, nothing else running).

Usage: python bench/store_bench.py [--messages N] [--sqlite-only] [--pg URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

from broker_core import AckMode, Broker, Queue

BODY = "x" * 2048
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

#: A/B runs: any Broker.open store options, as JSON (e.g. BENCH_STORE_OPTIONS='{"commit_delay": 0}')
STORE_OPTIONS = json.loads(os.environ.get("BENCH_STORE_OPTIONS") or "{}")


def raw_sqlite(path: str, rows: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS raw (id INTEGER PRIMARY KEY, box TEXT, body BLOB)")
    payload = BODY.encode()
    start = time.perf_counter()
    for _ in range(rows // 100):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO raw (box, body) VALUES (?, ?)", [("q", payload)] * 100)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return rows / elapsed


def raw_postgres(dsn: str, schema: str, rows: int) -> float:
    import psycopg

    payload = BODY.encode()
    with psycopg.connect(dsn, options=f"-csearch_path={schema}") as conn:
        conn.execute("CREATE TABLE raw (id bigserial PRIMARY KEY, box text, body bytea)")
        conn.commit()
        start = time.perf_counter()
        with conn.cursor() as cur:
            for _ in range(rows // 100):
                cur.executemany("INSERT INTO raw (box, body) VALUES (%s, %s)", [("q", payload)] * 100)
                conn.commit()
        return rows / (time.perf_counter() - start)


class _Consumers:
    """Two consumer threads in AUTO mode receiving ``total`` messages from ``queue``."""

    def __init__(self, broker: Broker, queue: Queue, total: int) -> None:
        self.received = 0
        self.total = total
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._broker, self._queue = broker, queue
        self._threads = [threading.Thread(target=self._consume) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def _consume(self) -> None:
        with self._broker.connect() as conn:
            conn.start()
            consumer = conn.create_session(False, AckMode.AUTO).create_consumer(self._queue)
            while not self.finished.is_set():
                if consumer.receive(timeout=0.2) is not None:
                    with self._lock:
                        self.received += 1
                        if self.received >= self.total:
                            self.finished.set()

    def join(self) -> None:
        self.finished.wait(timeout=600)
        for thread in self._threads:
            thread.join()


async def _produce(session: Any, producer: Any, count: int, window: asyncio.Semaphore | None) -> None:
    """Send ``count`` messages with ``send_async``, at most 64 in flight (or
    as many as the shared ``window`` allows)."""
    window = window or asyncio.Semaphore(64)
    pending: set[Any] = set()  # the sends in flight: each leaves the set when it completes

    def completed(future: Any) -> None:
        window.release()
        if future.exception() is None:  # a failed send stays, for gather() to raise
            pending.discard(future)

    for _ in range(count):
        await window.acquire()
        future = producer.send_async(session.create_text_message(BODY))
        future.add_done_callback(completed)
        pending.add(future)
    await asyncio.gather(*pending)


def end_to_end(url: str, producers: int, per_producer: int, use_async: bool) -> tuple[float, float]:
    """(msg/s, CPU us per message) in one process."""
    total = producers * per_producer
    queue = Queue(f"bench.{uuid.uuid4().hex[:8]}")
    with Broker.open(url, sweep_interval=0, **STORE_OPTIONS) as broker:
        consumers = _Consumers(broker, queue, total)
        start, cpu_before = time.perf_counter(), _cpu()
        if use_async:

            async def produce_all() -> None:
                conn = broker.connect()
                sessions = [conn.create_session() for _ in range(producers)]
                window = asyncio.Semaphore(64 * producers)
                await asyncio.gather(
                    *(_produce(session, session.create_producer(queue), per_producer, window) for session in sessions)
                )

            asyncio.run(produce_all())
        else:

            def produce() -> None:
                with broker.connect() as conn:
                    session = conn.create_session()
                    producer = session.create_producer(queue)
                    for _ in range(per_producer):
                        producer.send(session.create_text_message(BODY))

            threads = [threading.Thread(target=produce) for _ in range(producers)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        consumers.finished.wait(timeout=600)
        elapsed, cpu = time.perf_counter() - start, _cpu() - cpu_before
        consumers.join()
        return consumers.received / elapsed, cpu * 1e6 / max(1, consumers.received)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _producer_process(url: str, queue_name: str, count: int, start: Any, cpu_out: Any, producers: int = 1) -> None:
    """``producers`` producers (a session each, send_async with 64 in flight each) in this process."""
    with Broker.open(url, sweep_interval=0, **STORE_OPTIONS) as broker, broker.connect() as conn:
        sessions = [conn.create_session() for _ in range(producers)]
        pairs = [(session, session.create_producer(Queue(queue_name))) for session in sessions]
        start.wait()
        before = _cpu()

        async def produce_all() -> None:
            await asyncio.gather(
                *(_produce(session, producer, count // producers, None) for session, producer in pairs)
            )

        asyncio.run(produce_all())
        cpu_out.put(_cpu() - before)


def _consumer_process(url: str, queue_name: str, total: int, start: Any, done: Any, cpu_out: Any) -> None:
    with Broker.open(url, sweep_interval=0, **STORE_OPTIONS) as broker:
        consumers = _Consumers(broker, Queue(queue_name), total)
        start.wait()
        before = _cpu()
        consumers.finished.wait(timeout=600)
        done.put(time.time())
        cpu_out.put(_cpu() - before)
        consumers.join()


def end_to_end_processes(url: str, producers: int, total: int, processes: int | None = None) -> tuple[float, float]:
    """(msg/s, CPU us per message over all processes) with ``producers``
    producers spread over ``processes`` producer processes (one each by
    default) and one consumer process on one store."""
    ctx = multiprocessing.get_context("spawn")
    start, done, cpu_out = ctx.Event(), ctx.Queue(), ctx.Queue()
    name = f"bench.mp.{uuid.uuid4().hex[:8]}"
    processes = processes or producers
    per = total // processes  # messages each producer process sends
    sent = per * processes
    procs = [
        ctx.Process(target=_producer_process, args=(url, name, per, start, cpu_out, producers // processes))
        for _ in range(processes)
    ]
    procs.append(ctx.Process(target=_consumer_process, args=(url, name, sent, start, done, cpu_out)))
    for proc in procs:
        proc.start()
    time.sleep(3.0)  # every process has opened the store and is waiting
    began = time.time()
    start.set()
    ended = done.get(timeout=900)
    cpu = sum(cpu_out.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return sent / (ended - began), cpu * 1e6 / sent


def send_latency(url: str, count: int) -> tuple[float, float]:
    with Broker.open(url, sweep_interval=0, **STORE_OPTIONS) as broker, broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(Queue("bench.latency"))
        samples = []
        for i in range(count + 50):
            message = session.create_text_message(BODY)
            start = time.perf_counter()
            producer.send(message)
            if i >= 50:
                samples.append(time.perf_counter() - start)
        samples.sort()
        return statistics.median(samples) * 1e3, samples[int(len(samples) * 0.99)] * 1e3


def run(name: str, url: str, raw: float, messages: int) -> None:
    print(f"{name}: raw batched insert limit (100 x 2 KB per commit): {raw:,.0f} rows/s")
    for producers in (1, 4):
        for use_async in (False, True):
            rate, cpu = end_to_end(url, producers, messages // producers, use_async)
            kind = "async send_async, 64 in flight each" if use_async else "threads, synchronous send"
            print(
                f"  {producers} producer{'s' if producers > 1 else ' '} ({kind}): {rate:,.0f} msg/s end to end "
                f"({rate / raw:.0%} of raw), {cpu:.0f} us CPU per message"
            )
    for producers, processes in ((1, 1), (4, 4), (4, 1)):
        rate, cpu = end_to_end_processes(url, producers, messages, processes)
        where = (
            f"{producers} producer process{'es' if producers > 1 else ''}"
            if processes == producers
            else f"{producers} producers in 1 process"
        )
        print(
            f"  {where} + 1 consumer process: {rate:,.0f} msg/s "
            f"end to end ({rate / raw:.0%} of raw), {cpu:.0f} us CPU per message over all processes"
        )
    p50, p99 = send_latency(url, 1000)
    print(f"  single persistent send latency: p50 {p50:.2f} ms, p99 {p99:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--sqlite-only", action="store_true")
    parser.add_argument("--pg", default=os.environ.get("B2BGW_TEST_POSTGRES", PG_DEFAULT))
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="b2b-store-bench-")
    try:
        raw = raw_sqlite(os.path.join(tmp, "raw.db"), 20_000)
        run("SQLite (WAL, synchronous=FULL)", f"sqlite:///{os.path.join(tmp, 'bench.db')}", raw, args.messages)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.sqlite_only:
        return
    import psycopg

    from broker_core.sql import upgrade_database

    dsn = args.pg.replace("postgresql+psycopg://", "postgresql://")
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        raw = raw_postgres(dsn, schema, 20_000)
        url = f"{args.pg}?schema={schema}"
        upgrade_database(url)
        run("PostgreSQL", url, raw, args.messages)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


if __name__ == "__main__":
    main()
