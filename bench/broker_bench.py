"""Broker core benchmark (in-process, memory store).

Prints, in one run:
  1. non-persistent send + receive + acknowledge throughput for 2 KB text
     messages, one producer thread and one consumer thread (CLIENT acks every
     message; AUTO shown too);
  2. request-reply round trip p50/p99 through ``Requestor`` (responder thread);
  3. the time for a selective consumer to drain the 10% matches of a
     20,000-deep queue.

Usage: python bench/broker_bench.py [--messages N] [--rounds N] [--url memory://]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

from broker_core import AckMode, Broker, DeliveryMode, Queue, Requestor, reply_correlation_id

BODY = "x" * 2048


def throughput(url: str, count: int, ack_mode: AckMode) -> float:
    with Broker.open(url, sweep_interval=0) as broker:
        conn = broker.connect()
        conn.start()
        queue = Queue("bench.tp")
        done = threading.Event()

        def consume() -> None:
            session = conn.create_session(False, ack_mode)
            consumer = session.create_consumer(queue)
            for _ in range(count):
                message = consumer.receive(timeout=30)
                if ack_mode is AckMode.CLIENT:
                    message.acknowledge()
            done.set()

        consumer_thread = threading.Thread(target=consume)
        consumer_thread.start()
        session = conn.create_session()
        producer = session.create_producer(queue)
        producer.delivery_mode = DeliveryMode.NON_PERSISTENT
        create = session.create_text_message
        start = time.perf_counter()
        for _ in range(count):
            producer.send(create(BODY))
        done.wait()
        elapsed = time.perf_counter() - start
        consumer_thread.join()
        return count / elapsed


def request_reply(url: str, rounds: int) -> tuple[float, float, float]:
    with Broker.open(url, sweep_interval=0) as broker:
        conn = broker.connect()
        conn.start()
        stop = threading.Event()
        ready = threading.Event()

        def respond() -> None:
            session = conn.create_session()
            consumer = session.create_consumer(Queue("bench.svc"))
            producer = session.create_producer(None)
            producer.delivery_mode = DeliveryMode.NON_PERSISTENT
            ready.set()
            while not stop.is_set():
                request = consumer.receive(timeout=0.2)
                if request is None:
                    continue
                reply = session.create_text_message(request.text)
                reply.jms_correlation_id = reply_correlation_id(request)
                producer.send(request.jms_reply_to, reply)

        responder = threading.Thread(target=respond)
        responder.start()
        ready.wait()
        session = conn.create_session()
        requestor = Requestor(session, Queue("bench.svc"))
        samples = []
        for i in range(rounds + 200):
            message = session.create_text_message("ping")
            start = time.perf_counter()
            requestor.request(message, timeout=5, delivery_mode=DeliveryMode.NON_PERSISTENT)
            if i >= 200:  # warm-up
                samples.append(time.perf_counter() - start)
        stop.set()
        responder.join()
        samples.sort()
        return (
            statistics.median(samples) * 1e6,
            samples[int(len(samples) * 0.99)] * 1e6,
            samples[int(len(samples) * 0.999)] * 1e6,
        )


def selective_drain(url: str, depth: int = 20_000) -> tuple[float, int]:
    with Broker.open(url, sweep_interval=0) as broker:
        conn = broker.connect()
        conn.start()
        session = conn.create_session(transacted=True)
        producer = session.create_producer(Queue("bench.deep"))
        for i in range(depth):
            message = session.create_text_message("order")
            message.set_string_property("partner", "acme" if i % 10 == 0 else f"other{i % 7}")
            producer.send(message)
            if i % 1000 == 999:
                session.commit()
        session.commit()
        consumer = conn.create_session(False, AckMode.AUTO).create_consumer(
            Queue("bench.deep"), selector="partner = 'acme'"
        )
        start = time.perf_counter()
        got = 0
        while got < depth // 10:
            if consumer.receive(timeout=5) is None:
                break
            got += 1
        return time.perf_counter() - start, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="memory://")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    print(f"broker_core benchmark on {args.url} (Python {sys.version.split()[0]})")
    for mode in (AckMode.CLIENT, AckMode.AUTO):
        rate = throughput(args.url, args.messages, mode)
        print(
            f"  send+receive+ack, 2 KB non-persistent, 1 producer + 1 consumer thread, {mode.name}: {rate:,.0f} msg/s"
        )
    p50, p99, p999 = request_reply(args.url, args.rounds)
    print(
        f"  request-reply via Requestor ({args.rounds} rounds): p50 {p50:.0f} us, p99 {p99:.0f} us, p99.9 {p999:.0f} us"
    )
    elapsed, got = selective_drain(args.url)
    print(f"  selective consumer drained {got} matches (10%) of a 20,000-deep queue in {elapsed * 1000:.0f} ms")


if __name__ == "__main__":
    main()
