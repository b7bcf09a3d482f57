"""``b2bgw archive run|status|get|verify``: the ledger's archive from the command line (docs/retention.md).
:func:`register` adds them to the gateway's parser."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from collections.abc import Callable
from typing import Any

from gateway.cli.support import CommandError, existing_store_engine, settings_for
from gateway.config.loader import Settings
from gateway.ledger.stats import shown_ms

__all__ = ["register"]


def register(
    sub: Any,
    with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser],
    needs_action: Callable[[argparse.ArgumentParser, str], Any],
) -> None:
    """Add ``archive ...`` to the commands (*sub*)."""
    archive = needs_action(
        sub.add_parser("archive", help="the ledger's archive: run it, list its runs, get a document back, check it"),
        "archive",
    )
    p = with_config(archive.add_parser("run", help="archive and purge the documents due under ledger.retention"))
    p.add_argument("--limit", type=int, default=None, metavar="N", help="purge at most about N documents")
    p.add_argument("--no-vacuum", action="store_true", help="do not give freed pages back afterwards (SQLite)")
    p.set_defaults(func=cmd_archive_run)
    p = with_config(archive.add_parser("status", help="the archive job's runs and unfinished batches"))
    p.add_argument("--limit", type=int, default=10, help="runs to list (10)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_archive_status)
    p = with_config(archive.add_parser("get", help="an archived document: its record, history, request, reply"))
    p.add_argument("message_id", help="the message id it was accepted as (ID:...)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--request", action="store_true", help="print only the request XML")
    what.add_argument("--reply", action="store_true", help="print only the reply XML")
    what.add_argument("--json", action="store_true", help="everything as JSON (the XML as strings)")
    p.set_defaults(func=cmd_archive_get)
    p = with_config(archive.add_parser("verify", help="check that the archive and the ledger agree"))
    p.set_defaults(func=cmd_archive_verify)


def _policy(settings: Settings) -> Any:
    if settings.retention is None:
        raise CommandError(
            f"{settings.config_path}: no ledger.retention section: documents stay online for ever; "
            "add one (docs/retention.md) to archive and purge them"
        )
    return settings.retention


def _root(settings: Settings) -> str:
    from spark_etl.archive import archive_root

    return archive_root(settings.retention, settings.etl)


# --------------------------------------------------------------------------- archive


def cmd_archive_run(args: argparse.Namespace) -> int:
    from gateway.cli.audit import audit_cli
    from gateway.runtime.serving import etl_enabled, open_broker
    from spark_etl.archive import ArchiveBusyError, ArchiveError, run, store_writer

    settings = settings_for(args)
    policy = _policy(settings)
    broker = open_broker(settings, sweep_interval=0)
    try:
        try:
            result = run(
                policy,
                engine=broker.engine,
                write=store_writer(broker),
                purge_write=store_writer(broker, durable=False),
                root=_root(settings),
                db_url=settings.store_url,
                wait_for_warehouse=etl_enabled(settings),
                vacuum=not args.no_vacuum,
                limit=args.limit,
            )
        except ArchiveBusyError as exc:
            print(f"archive: {exc}; nothing done", file=sys.stderr)
            return 3
        except ArchiveError as exc:
            print(f"archive: FAILED: {exc}", file=sys.stderr)
            return 1
        audit_cli(
            broker.write,
            "archive-run",
            count=result.purged,
            detail=f"b2bgw archive run {result.run_id}: {result.status}, {result.archived} archived, "
            f"{result.purged} purged",
        )
    finally:
        broker.close()
    print(
        f"archive run {result.run_id} {result.status}: {result.archived:,} documents archived "
        f"({result.bytes:,} bytes) and {result.purged:,} purged in {result.batches} batches, "
        f"{result.waiting:,} due but waiting for the warehouse load, {result.tombstones_expired:,} tombstones "
        f"expired, {result.vacuumed_pages:,} pages given back, in {result.seconds:.1f}s"
        + (f"; finished {result.recovered} batches a crashed run left" if result.recovered else "")
    )
    return 0


def cmd_archive_status(args: argparse.Namespace) -> int:
    from ledger_contract import lifecycle

    settings = settings_for(args)
    engine = existing_store_engine(settings)
    try:
        runs = lifecycle.list_runs(engine, args.limit)
        pending = lifecycle.open_batches(engine) if runs else []
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"runs": runs, "unfinished_batches": pending}, indent=2, default=str))
        return 0
    policy = settings.retention
    if policy is None:
        print("retention: none configured (ledger.retention): nothing is archived")
    else:
        print(
            f"retention: {'enabled' if policy.enabled else 'disabled'}, schedule {policy.schedule} "
            f"({policy.timezone}), archive {_root(settings)}"
        )
    header = ["run", "outcome", "started (UTC)", "ended (UTC)", "archived", "purged", "waiting", "expired", "error"]
    rows = [
        [
            str(r["run_id"]),
            r["status"],
            shown_ms(r["started_at"]),
            shown_ms(r["finished_at"]),
            f"{r['archived']:,}",
            f"{r['purged']:,}",
            f"{r['waiting']:,}",
            f"{r['tombstones_expired']:,}",
            (r["error"] or "").splitlines()[0][:80] if r["error"] else "",
        ]
        for r in runs
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip())
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip())
    if not rows:
        print("(no runs yet)")
    for b in pending:
        print(
            f"unfinished batch {b['batch_id']} of run {b['run_id']}: {b['status']} ({b['documents']} documents); "
            "the next run finishes it"
        )
    return 0


def cmd_archive_get(args: argparse.Namespace) -> int:
    from gateway.cli.audit import audit_cli, engine_writer
    from spark_etl.archive import get

    settings = settings_for(args)
    engine = existing_store_engine(settings)
    try:
        found = get(args.message_id, root=_root(settings), engine=engine)
        audit_cli(
            engine_writer(engine),
            "archive-get",
            target=args.message_id[:600],
            outcome="done" if found is not None else "refused",
            detail="b2bgw archive get"
            + (" --request" if args.request else "")
            + (" --reply" if args.reply else "")
            + ("" if found is not None else ": not in the archive"),
        )
    finally:
        engine.dispose()
    if found is None:
        raise CommandError(
            f"{args.message_id}: not in the archive at {_root(settings)} (a document still online is "
            "at GET /v1/documents/ID; one purged without an archive copy is not kept)"
        )
    if args.request:
        sys.stdout.buffer.write(found.request)
        return 0
    if args.reply:
        if found.reply is None:
            raise CommandError(f"{args.message_id} has no reply")
        sys.stdout.buffer.write(found.reply)
        return 0
    record = {k: (v.isoformat() if isinstance(v, _dt.datetime) else v) for k, v in found.record.items()}
    history = [{"seq": h["seq"], "status": h["status"], "at": h["at"].isoformat()} for h in found.history]
    if args.json:
        print(
            json.dumps(
                {
                    "record": record,
                    "history": history,
                    "request": found.request.decode("utf-8"),
                    "reply": found.reply.decode("utf-8") if found.reply is not None else None,
                    "file": found.file,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        return 0
    for key, value in record.items():
        print(f"{key}: {value}")
    print("history:")
    for h in history:
        print(f"  {h['at']}  {h['status']}")
    print(f"file: {found.file}")
    print(f"request: {len(found.request):,} bytes (--request prints it)")
    print(f"reply: {len(found.reply):,} bytes (--reply prints it)" if found.reply is not None else "reply: none")
    return 0


def cmd_archive_verify(args: argparse.Namespace) -> int:
    from spark_etl.archive import verify

    settings = settings_for(args)
    engine = existing_store_engine(settings)
    try:
        report = verify(engine, _root(settings))
    finally:
        engine.dispose()
    print(
        f"archive {_root(settings)}: {report['archive_rows']:,} documents in {report['batches']} batches, "
        f"{report['tombstones']:,} tombstones: " + ("the archive and the ledger agree" if report["ok"] else "PROBLEMS")
    )
    for problem in report["problems"]:
        print(f"  {problem}")
    return 0 if report["ok"] else 1
