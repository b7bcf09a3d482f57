"""``b2bgw queues``, ``b2bgw browse`` and ``b2bgw dlq replay``: the broker's queues from the command line."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from gateway.cli.support import CommandError, int_at_least, settings_for
from gateway.config.loader import Settings

__all__ = ["register"]


def register(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
    needs_action: Callable[[argparse.ArgumentParser, str], Any],
) -> None:
    """Add ``queues``, ``browse`` and ``dlq replay`` to the commands (*sub*)."""
    p = with_config(sub.add_parser("queues", help="depth, in-flight and dead letters of every queue"))
    p.set_defaults(func=cmd_queues)

    p = with_config(sub.add_parser("browse", help="the messages waiting in a queue"))
    p.add_argument("destination", help="queue://NAME or NAME")
    p.add_argument("--selector", help="a JMS message selector")
    p.add_argument(
        "--limit", type=int_at_least(1, "at least 1"), default=20, help="at most this many messages (default 20)"
    )
    p.add_argument("--body", action="store_true", help="print whole bodies")
    p.set_defaults(func=cmd_browse)

    dlq = needs_action(sub.add_parser("dlq", help="dead-letter queues"), "dlq")
    p = with_config(dlq.add_parser("replay", help="move a dead-letter queue's messages back to their queue"))
    p.add_argument("destination", help="the dead-letter queue (queue://DLQ.NAME) or the queue it is for")
    p.set_defaults(func=cmd_dlq)


def _open(args: argparse.Namespace) -> Any:
    from gateway.runtime.serving import open_broker

    settings = settings_for(args)
    return settings, open_broker(settings, sweep_interval=0)


def cmd_queues(args: argparse.Namespace) -> int:
    settings, broker = _open(args)
    try:
        stats = {s.name: s for s in broker.destinations()}
        prefix = f"queue://{broker.policy.dead_letter_prefix}"
        names = {name for name in stats if name.startswith("queue://") and not name.startswith(prefix)}
        names |= _route_queues(settings)
        orphans = {name for name in stats if name.startswith(prefix) and "queue://" + name[len(prefix) :] not in names}
        rows = [("QUEUE", "DEPTH", "IN-FLIGHT", "DEAD-LETTERS", "CONSUMERS")]
        for name in sorted(names):
            s = stats.get(name)
            dlq = stats.get(prefix + name[len("queue://") :])
            rows.append(
                (
                    name,
                    str(s.depth if s else 0),
                    str(s.in_flight if s else 0),
                    str(dlq.depth if dlq else 0),
                    str(s.consumers) if s and s.consumers else "-",
                )
            )
        for name in sorted(orphans):
            s = stats[name]
            rows.append((name, str(s.depth), str(s.in_flight), "-", "-"))
        topics = sorted(n for n, s in stats.items() if s.topic)
        for name in topics:
            s = stats[name]
            rows.append((f"{name} ({s.topic})", str(s.depth), str(s.in_flight), "-", "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
        print("(consumers of every process sharing the store, as of their last heartbeat, about a second ago)")
    finally:
        broker.close()
    return 0


def _route_queues(settings: Settings) -> set[str]:
    """The queues the configured routes send to."""
    names = set()
    for item in settings.routes:
        if isinstance(item, dict) and isinstance(item.get("destination"), str):
            dest = item["destination"].strip()
            if dest.startswith("queue://"):
                names.add(dest)
    return names


def _require_known(settings: Settings, broker: Any, *queues: Any) -> None:
    """CommandError unless one of *queues* is routed to or has something in the store (a mistyped name)."""
    known = {s.name for s in broker.destinations()} | _route_queues(settings)
    if any(str(queue) in known for queue in queues):
        return
    shown = sorted(name for name in known if name.startswith("queue://"))
    listed = ", ".join(shown[:8]) + (", ..." if len(shown) > 8 else "") if shown else "none yet"
    raise CommandError(
        f"no queue {queues[0]} is known: no route sends to it and the store holds nothing for it; "
        f"check the name (known queues: {listed}; `b2bgw queues` lists them)"
    )


def _queue_name(text: str) -> Any:
    from broker_core import InvalidDestinationError, Queue, parse_destination

    try:
        dest = parse_destination(text) if "://" in text else Queue(text)
    except InvalidDestinationError as exc:
        raise CommandError(f"{text!r}: {exc}; name a queue as queue://NAME or NAME") from None
    if dest.is_topic or dest.is_temporary:
        raise CommandError(
            f"{text}: only queues can be browsed or replayed (not topics or temporary queues); "
            "name one as queue://NAME or NAME"
        )
    return dest


def _browse(broker: Any, queue: Any, selector: str | None, limit: int) -> Any:
    """The broker's browse, a bad selector reported as the user's (it is compiled before the first message)."""
    from broker_core import InvalidSelectorError

    try:
        yield from broker.browse(queue, selector, limit)
    except InvalidSelectorError as exc:
        raise CommandError(
            f"--selector {selector!r}: {str(exc).splitlines()[0]}; write a JMS (SQL-92) condition on "
            "the message properties, e.g. \"InvoiceID = 'A-1' AND TotalAmount > 100\""
        ) from None


def cmd_browse(args: argparse.Namespace) -> int:
    from gateway.cli.audit import audit_cli

    queue = _queue_name(args.destination)
    settings, broker = _open(args)
    try:
        count = 0
        for message in _browse(broker, queue, args.selector, args.limit):
            count += 1
            props = {name: message.get_object_property(name) for name in message.property_names()}
            print(
                f"{message.jms_message_id}  priority {message.jms_priority}  "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(message.jms_timestamp / 1000))}  "
                f"type {message.jms_type or '-'}  correlation {message.jms_correlation_id or '-'}"
            )
            print(f"  properties {json.dumps(props, default=str, ensure_ascii=False)}")
            text = getattr(message, "text", None)
            if text is not None:
                shown = text if args.body else text[:200].replace("\n", " ") + ("..." if len(text) > 200 else "")
                print(f"  body {shown}")
        if not count:  # after the selector's check: a bad selector is reported whatever the queue
            _require_known(settings, broker, queue)
        audit_cli(
            broker.write,
            "browse",
            target=str(queue),
            count=count,
            detail="b2bgw browse"
            + (" --body" if args.body else "")
            + (f" --selector {args.selector}" if args.selector else ""),
        )
        print(f"{count} message{'s' if count != 1 else ''} in {queue}")
    finally:
        broker.close()
    return 0


def cmd_dlq(args: argparse.Namespace) -> int:
    from broker_core import Queue
    from gateway.cli.audit import audit_cli
    from gateway.ledger.reconciler import Reconciler
    from gateway.ledger.records import Ledger

    queue = _queue_name(args.destination)
    settings, broker = _open(args)
    try:
        prefix = broker.policy.dead_letter_prefix
        dlq = queue if queue.name.startswith(prefix) else Queue(prefix + queue.name)
        _require_known(settings, broker, queue, dlq)
        ids = [m.jms_message_id for m in broker.browse(dlq)]
        moved = broker.replay_dead_letters(dlq)
        reconciler = Reconciler(broker, Ledger(broker.engine))
        reset = reconciler.after_replay(ids)
        audit_cli(broker.write, "replay", target=f"{dlq}", count=moved, message_ids=ids, detail="b2bgw dlq replay")
        print(
            f"moved {moved} message{'s' if moved != 1 else ''} from {dlq} back to their queue; "
            f"{reset} ledger document{'s' if reset != 1 else ''} back to 'accepted'"
        )
    finally:
        broker.close()
    return 0
