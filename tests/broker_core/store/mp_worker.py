"""Broker client processes for the multi-process tests.

Roles (argv: role url out_path [args]):
  consume N        - receive until N messages were received in all (by this
                     process) or 5 s pass idle; write "key recv_ns" lines.
  respond          - answer requests on queue://svc until a "stop" request.
  produce N NAME   - send N messages keyed NAME-i (also receiving on the side
                     when argv has "and-consume"), write "sent"/"got" counts.
"""

from __future__ import annotations

import os
import sys
import time

from broker_core import AckMode, Broker, Queue, reply_correlation_id

OPTIONS = dict(
    sweep_interval=0,
    heartbeat_interval=0.5,
    lease_timeout=5.0,
    **({"poll_interval": float(os.environ["MP_POLL_INTERVAL"])} if os.environ.get("MP_POLL_INTERVAL") else {}),
    **({"local_wakeups": False} if os.environ.get("MP_NO_WAKEUPS") else {}),
)


def main() -> None:
    role, url, out = sys.argv[1:4]
    broker = Broker.open(url, **OPTIONS)
    conn = broker.connect()
    conn.start()
    lines: list[str] = []
    try:
        if role == "consume":
            limit = int(sys.argv[4])
            session = conn.create_session(False, AckMode.CLIENT)
            consumer = session.create_consumer(Queue("mp.work"))
            with open(out + ".ready", "w"):
                pass
            idle = time.monotonic()
            while len(lines) < limit and time.monotonic() - idle < 5.0:
                msg = consumer.receive(timeout=0.5)
                if msg is None:
                    continue
                idle = time.monotonic()
                lines.append(f"{msg.text} {time.monotonic_ns()}")
                msg.acknowledge()
        elif role == "respond":
            session = conn.create_session()
            consumer = session.create_consumer(Queue("svc"))
            producer = session.create_producer(None)
            with open(out + ".ready", "w"):
                pass
            while True:
                request = consumer.receive(timeout=30)
                if request is None or request.text == "stop":
                    break
                reply = session.create_text_message(f"reply to {request.text} from pid {os.getpid()}")
                reply.jms_correlation_id = reply_correlation_id(request)
                producer.send(request.jms_reply_to, reply)
                lines.append(request.text)
        elif role == "produce":
            count, name = int(sys.argv[4]), sys.argv[5]
            also_consume = "and-consume" in sys.argv
            session = conn.create_session()
            producer = session.create_producer(Queue("mp.load"))
            consumer = session.create_consumer(Queue("mp.load")) if also_consume else None
            got = 0
            for i in range(count):
                producer.send(session.create_text_message(f"{name}-{i}"))
                if consumer is not None and consumer.receive_no_wait() is not None:
                    got += 1
            lines.append(f"sent {count}")
            lines.append(f"got {got}")
    finally:
        conn.close()
        broker.close()
    with open(out, "w") as fh:
        fh.write("\n".join(lines) + ("\n" if lines else ""))


if __name__ == "__main__":
    main()
