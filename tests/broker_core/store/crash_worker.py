"""A producer or consumer process for the crash test (killed with SIGKILL).

Every line it logs is written with os.write, so what the log says happened
did happen before any kill:
  producer: ``S key`` after send() returned;
  consumer: ``D key redelivered t`` when a message is received, ``A key t``
  after acknowledge() returned (``L key - t`` when it raised LeaseExpiredError:
  not acknowledged, it comes back), where ``t`` is CLOCK_MONOTONIC in ns (one
  clock for every process of the machine, so two consumers' logs interleave
  correctly).
"""

from __future__ import annotations

import os
import sys
import time

from broker_core import AckMode, Broker, LeaseExpiredError, Queue

QUEUE = Queue("crash.test")
STORE_OPTIONS = dict(heartbeat_interval=0.25, lease_timeout=2.0, sweep_interval=0, prefetch=8)


def main() -> None:
    role, url, log_path, incarnation = sys.argv[1:5]
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    broker = Broker.open(url, **STORE_OPTIONS)
    conn = broker.connect()
    conn.start()
    if role == "producer":
        first, last = int(sys.argv[5]), int(sys.argv[6])
        session = conn.create_session()
        producer = session.create_producer(QUEUE)
        for i in range(first, last):
            key = f"{i}.{incarnation}"
            msg = session.create_text_message(key)
            msg.set_string_property("key", key)
            producer.send(msg)
            os.write(fd, f"S {key}\n".encode())
    else:
        done_flag = sys.argv[5]
        session = conn.create_session(False, AckMode.CLIENT)
        consumer = session.create_consumer(QUEUE)
        while True:
            msg = consumer.receive(timeout=0.2)
            if msg is None:
                if os.path.exists(done_flag):
                    stats = broker.stats(QUEUE)  # the whole database: every process's messages
                    if stats.depth == 0 and stats.in_flight == 0:
                        break
                continue
            key = msg.text
            os.write(fd, f"D {key} {int(msg.jms_redelivered)} {time.monotonic_ns()}\n".encode())
            try:
                msg.acknowledge()
            except LeaseExpiredError:  # presumed dead while busy: it is redelivered, like a rollback
                os.write(fd, f"L {key} - {time.monotonic_ns()}\n".encode())
                continue
            os.write(fd, f"A {key} - {time.monotonic_ns()}\n".encode())
    conn.close()
    broker.close()
    os.close(fd)


if __name__ == "__main__":
    main()
