"""``b2bgw deliveries`` (per endpoint: pending, in flight, failing since, dead), ``deliveries show|replay|
discard``, and ``b2bgw deliver --partner P FILE`` (push a document by hand)."""

from __future__ import annotations

import argparse
import getpass
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.support import CommandError, settings_for

__all__ = ["register"]


def register(sub: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    group = with_config(sub.add_parser("deliveries", help="outbound deliveries per partner endpoint"))
    group.set_defaults(func=cmd_deliveries)
    actions = group.add_subparsers(dest="deliveries_command", metavar="ACTION")
    p = with_config(actions.add_parser("show", help="one delivery and its timeline of attempts"))
    p.add_argument("message_id")
    p.set_defaults(func=cmd_show)
    for name, text in (
        ("replay", "send dead deliveries again (a fresh count of attempts)"),
        ("discard", "drop dead deliveries (the ledger keeps them as discarded)"),
    ):
        p = with_config(actions.add_parser(name, help=text))
        p.add_argument("--partner", required=True)
        p.add_argument("--endpoint", required=True)
        p.add_argument("message_ids", nargs="*", help="the deliveries (default: every dead one of the endpoint)")
        p.set_defaults(func=cmd_replay if name == "replay" else cmd_discard)
    p = with_config(sub.add_parser("deliver", help="push a document to a partner's endpoint by hand"))
    p.add_argument("--partner", required=True)
    p.add_argument("--endpoint", help="the partner's endpoint (default: its only one)")
    p.add_argument("--content-type", default="application/xml")
    p.add_argument("file", type=Path)
    p.set_defaults(func=cmd_deliver)


def _open(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from gateway.routing.partners import PartnerRegistry
    from gateway.runtime.serving import open_broker

    settings = settings_for(args)
    partners = PartnerRegistry.from_settings(settings)
    return settings, partners, open_broker(settings, sweep_interval=0)


def _endpoint(partners: Any, partner: str, endpoint: str | None, *, documents: bool = False) -> Any:
    found = partners.get(partner)
    if found is None:
        raise CommandError(f"no partner {partner!r} in partners.yaml")
    endpoints = {n: e for n, e in found.delivery.endpoints.items() if not (documents and e.implicit)}
    if endpoint is None:
        if len(endpoints) != 1:
            raise CommandError(
                f"partner {partner!r} has {len(endpoints)} endpoints "
                f"({', '.join(sorted(endpoints)) or 'none'}): name one with --endpoint"
            )
        return next(iter(endpoints.values()))
    if endpoint not in endpoints:
        raise CommandError(
            f"partner {partner!r} has no endpoint {endpoint!r}; its endpoints: "
            f"{', '.join(sorted(endpoints)) or 'none (add one under endpoints: in partners.yaml)'}"
        )
    return endpoints[endpoint]


def _when(ms: int | None) -> str:
    return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def cmd_deliveries(args: argparse.Namespace) -> int:
    from broker_core import Queue
    from gateway.delivery.records import DeliveryLedger
    from gateway.delivery.running import all_endpoints

    _settings, partners, broker = _open(args)
    try:
        summary = {(s.partner, s.endpoint): s for s in DeliveryLedger(broker.engine).summary()}
        rows = [("PARTNER/ENDPOINT", "PENDING", "IN-FLIGHT", "FAILING-SINCE", "DEAD")]
        for endpoint in all_endpoints(partners):
            s = summary.get((endpoint.partner, endpoint.name))
            stats = broker.stats(Queue(endpoint.queue))
            dead = broker.stats(Queue(endpoint.dead_queue))
            rows.append(
                (
                    f"{endpoint.partner}/{endpoint.name}",
                    str(stats.depth),
                    str(stats.in_flight),
                    _when(s.failing_since) if s else "-",
                    str(dead.depth),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        for r in rows:
            print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    finally:
        broker.close()
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from gateway.delivery.records import DeliveryLedger

    _settings, _partners, broker = _open(args)
    try:
        row = DeliveryLedger(broker.engine).get(args.message_id)
        if row is None:
            raise CommandError(f"no delivery {args.message_id!r} in the ledger")
        print(
            f"{row.message_id}  {row.partner}/{row.endpoint}  {row.status}  source {row.source}  "
            f"queued {_when(row.created_at)}"
        )
        for a in row.timeline:
            print(f"  #{a.attempt}  {_when(a.at)}  {a.outcome:9}  {a.status or '-':>3}  {a.duration_ms} ms  {a.detail}")
    finally:
        broker.close()
    return 0


def _operate(args: argparse.Namespace, action: str) -> int:
    from gateway.admin import deliveries_ops as operations

    _settings, partners, broker = _open(args)
    try:
        endpoint = _endpoint(partners, args.partner, args.endpoint)
        done = getattr(operations, action)(
            broker, endpoint, args.message_ids or None, operator=f"cli:{getpass.getuser()}"
        )
        print(
            f"{ {'replay': 'replayed', 'discard': 'discarded'}[action] } {len(done)} dead deliver{'y' if len(done) == 1 else 'ies'} of {args.partner}/"
            f"{args.endpoint}"
        )
    finally:
        broker.close()
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    return _operate(args, "replay")


def cmd_discard(args: argparse.Namespace) -> int:
    return _operate(args, "discard")


def cmd_deliver(args: argparse.Namespace) -> int:
    from gateway.delivery.outbox import queue_delivery

    try:
        body = args.file.read_bytes()
    except OSError as exc:
        raise CommandError(f"cannot read {args.file}: {exc.strerror}") from None
    _settings, partners, broker = _open(args)
    try:
        endpoint = _endpoint(partners, args.partner, args.endpoint, documents=True)
        message_id = queue_delivery(
            broker, endpoint, body, content_type=args.content_type, source=f"cli:{getpass.getuser()}:{args.file.name}"
        )
    finally:
        broker.close()
    print(
        f"queued {message_id} for {endpoint.partner}/{endpoint.name}; follow it with "
        f"`b2bgw deliveries show {message_id}`"
    )
    return 0
