"""STOMP listener benchmark, driven by stomp.py over loopback.

    python bench/stomp_bench.py [--messages 20000] [--size 2048] [--rounds 2000]

Starts ``python -m broker_core.stomp`` on a fresh SQLite store (port chosen by
the OS, one user ``bench`` with every right) in a subprocess, then prints in
one run:

* end-to-end throughput (first send to last receive) of N messages of SIZE
  bytes, non-persistent and persistent;
* request-reply round trip p50/p99 over ROUNDS rounds through a temporary
  queue (a stomp.py requester and a stomp.py responder);
* a selective subscriber on an N-deep queue where 10% match: time until every
  matching message has arrived.

Reference (ActiveMQ 5.17, same client, same machine class): ~14-15k msg/s
non-persistent, ~6.3k msg/s persistent, request-reply p50 0.4-0.5 ms / p99
1.5-4 ms; its selective subscriber got 58 of 1,560 matches in 60 s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, NamedTuple

import stomp


class Target(NamedTuple):
    """A STOMP broker to drive: address and the login the clients use."""

    host: str
    port: int
    login: str = "bench"
    passcode: str = "bench"


class Counter(stomp.ConnectionListener):
    def __init__(self, target: int) -> None:
        self.count = 0
        self.target = target
        self.done = threading.Event()
        self.errors: list[Any] = []

    def on_message(self, frame: Any) -> None:
        self.count += 1
        if self.count >= self.target:
            self.done.set()

    def on_error(self, frame: Any) -> None:
        self.errors.append(frame)
        print("ERROR frame:", frame.headers, frame.body, file=sys.stderr)


class Receipts(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ids: set[str] = set()

    def on_receipt(self, frame: Any) -> None:
        with self.cond:
            self.ids.add(frame.headers["receipt-id"])
            self.cond.notify_all()

    def wait(self, rid: str, timeout: float = 120) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: rid in self.ids, timeout):
                raise TimeoutError(f"no receipt {rid}")


def connect(target: Target, listener: Any = None, **kw: Any) -> Any:
    conn = stomp.Connection12([(target.host, target.port)], heartbeats=(0, 0), **kw)
    if listener is not None:
        conn.set_listener("l", listener)
    conn.connect(target.login, target.passcode, wait=True)
    return conn


def start_server(url: str) -> tuple[subprocess.Popen, int]:
    from broker_core.stomp import hash_passcode

    # the clients log in as bench/bench, a user with every right (the listener checks it like any other)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "broker_core.stomp",
            "--url",
            url,
            "--port",
            "0",
            "--log-level",
            "WARNING",
            "--heartbeat",
            "0,0",
            "--user",
            "bench:" + hash_passcode("bench"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        match = re.search(r"STOMP listening on [\d.]+:(\d+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, int(match.group(1))
    raise RuntimeError("the STOMP server did not start")


def throughput(
    target: Target,
    n: int,
    size: int,
    persistent: bool,
    queue: str,
    receipt_every: int = 0,
    *,
    split: bool = False,
    child_cpu: list[float] | None = None,
) -> float:
    """Messages per second from the first SEND to the last MESSAGE; with ``receipt_every``, every such
    SEND asks for a RECEIPT (not waited for: the stream goes on), as a producer that checks now and
    then that what it sent is stored. ``split``: the consumer runs in a process of its own (the producer
    stays in this one), so that the two clients do not share one interpreter lock; its processor seconds
    are appended to ``child_cpu``."""
    if split:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        child = ctx.Process(target=_consume, args=(target, n, queue, results), daemon=True)
        child.start()
        try:
            if results.get(timeout=60) != "ready":
                raise RuntimeError("the consumer process did not subscribe")
            started, finished, cpu = _produce(target, n, size, persistent, queue, receipt_every, results)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        if child_cpu is not None:
            child_cpu.append(cpu)
        return n / (finished - started)
    counter = Counter(n)
    consumer = connect(target, counter)
    consumer.subscribe(f"/queue/{queue}", id="c", ack="auto")
    started, finished, _ = _produce(target, n, size, persistent, queue, receipt_every, None, counter)
    consumer.disconnect()
    return n / (finished - started)


def _produce(
    target: Target,
    n: int,
    size: int,
    persistent: bool,
    queue: str,
    receipt_every: int,
    results: Any,
    counter: Counter | None = None,
) -> tuple[float, float, float]:
    """Send the stream; wait for its consumer (``counter`` here, or the consumer process's answer on
    ``results``). Returns the start, the last MESSAGE's time and the consumer process's CPU seconds."""
    sync = Receipts()
    producer = connect(target, sync)
    body = b"x" * size
    headers = {"persistent": "true" if persistent else "false"}
    time.sleep(0.2)
    start = time.perf_counter()
    last = None
    for i in range(n):
        if receipt_every and i % receipt_every == receipt_every - 1:
            last = f"{queue}-{i}"
            producer.send(f"/queue/{queue}", body, headers={**headers, "receipt": last})
        else:
            producer.send(f"/queue/{queue}", body, headers=headers)
    finished, cpu = 0.0, 0.0
    if counter is not None:
        if not counter.done.wait(300):
            raise TimeoutError(f"received {counter.count} of {n}")
        finished = time.perf_counter()
    else:
        answer = results.get(timeout=300)
        if not isinstance(answer, tuple):
            raise TimeoutError(f"the consumer process: {answer}")
        finished, cpu = answer
    if last is not None:
        sync.wait(last)
    producer.disconnect()
    return start, finished, cpu


def _consume(target: Target, n: int, queue: str, results: Any) -> None:
    """The consumer process of a split :func:`throughput`: subscribes, says ready, then answers with the
    time of the n-th MESSAGE (``time.perf_counter``: the system's monotonic clock, the same in every
    process on Linux) and its own processor seconds."""
    cpu = sum(os.times()[:2])
    counter = Counter(n)
    consumer = connect(target, counter)
    consumer.subscribe(f"/queue/{queue}", id="c", ack="auto")
    results.put("ready")
    if not counter.done.wait(300):
        results.put(f"received {counter.count} of {n}")
        return
    finished = time.perf_counter()
    results.put((finished, sum(os.times()[:2]) - cpu))
    consumer.disconnect()


def request_reply(target: Target, rounds: int, queue: str = "rr") -> tuple[float, float]:
    responder_conn: Any = None

    class Responder(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            responder_conn.send(
                frame.headers["reply-to"], frame.body, headers={"correlation-id": frame.headers["message-id"]}
            )

    responder_conn = connect(target, Responder())
    responder_conn.subscribe(f"/queue/{queue}", id="r", ack="auto")

    class Requester(stomp.ConnectionListener):
        def __init__(self) -> None:
            self.event = threading.Event()

        def on_message(self, frame: Any) -> None:
            self.event.set()

    requester = Requester()
    conn = connect(target, requester)
    conn.subscribe("/temp-queue/replies", id="t", ack="auto")
    time.sleep(0.2)
    times = []
    for i in range(rounds + 100):
        requester.event.clear()
        start = time.perf_counter()
        conn.send(f"/queue/{queue}", "ping", headers={"reply-to": "/temp-queue/replies"})
        if not requester.event.wait(10):
            raise TimeoutError(f"no reply in round {i}")
        if i >= 100:  # warm-up rounds are not counted
            times.append(time.perf_counter() - start)
    conn.disconnect()
    responder_conn.disconnect()
    times.sort()
    return times[len(times) // 2] * 1000, times[int(len(times) * 0.99)] * 1000


def selective(target: Target, n: int, size: int, queue: str = "selective", wait: float = 120) -> tuple[int, int, float]:
    sync = Receipts()
    producer = connect(target, sync)
    body = b"y" * size
    matches = 0
    for i in range(n):
        match = i % 10 == 0
        matches += match
        producer.send(f"/queue/{queue}", body, headers={"kind": "wanted" if match else "other", "persistent": "true"})
    producer.send(f"/queue/{queue}", b"", headers={"kind": "marker"}, receipt="filled")
    sync.wait("filled")
    counter = Counter(matches)
    consumer = connect(target, counter)
    start = time.perf_counter()
    consumer.subscribe(
        f"/queue/{queue}",
        id="s",
        ack="client-individual",
        headers={"selector": "kind = 'wanted'", "activemq.prefetchSize": "1000"},
    )

    # acknowledge as they come (client-individual), from the receiver thread
    class Acker(stomp.ConnectionListener):
        def on_message(self, frame: Any) -> None:
            consumer.ack(frame.headers["ack"])

    consumer.set_listener("ack", Acker())
    counter.done.wait(wait)
    elapsed = time.perf_counter() - start
    got = counter.count
    consumer.disconnect()
    producer.disconnect()
    return got, matches, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="stomp-bench-", dir="/tmp/stomp" if os.path.isdir("/tmp/stomp") else None)
    url = f"sqlite:///{workdir}/bench.db"
    proc, port = start_server(url)
    target = Target("127.0.0.1", port)
    try:
        print(f"STOMP listener pid {proc.pid} on 127.0.0.1:{port}, store {url}; client stomp.py {stomp.__version__}")
        rate = throughput(target, args.messages, args.size, False, "np")
        print(f"non-persistent: {args.messages} x {args.size} B end-to-end {rate:,.0f} msg/s  (ActiveMQ 5.17: ~14-15k)")
        rate = throughput(target, args.messages, args.size, True, "p")
        print(f"persistent:     {args.messages} x {args.size} B end-to-end {rate:,.0f} msg/s  (ActiveMQ 5.17: ~6.3k)")
        p50, p99 = request_reply(target, args.rounds)
        print(
            f"request-reply via temp queue, {args.rounds} rounds: p50 {p50:.2f} ms, p99 {p99:.2f} ms  "
            f"(ActiveMQ 5.17: 0.4-0.5 / 1.5-4 ms)"
        )
        got, matches, elapsed = selective(target, args.messages, args.size)
        print(
            f"selective subscriber on a {args.messages}-deep queue, 10% match: {got} of {matches} in "
            f"{elapsed:.2f} s  (ActiveMQ 5.17: 58 of 1,560 in 60 s)"
        )
        return 0 if got == matches else 1
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
