"""``b2bgw db upgrade|stats|vacuum``: the store's migrations, what it holds, and the space purges freed."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

from gateway.cli.support import CommandError, existing_store_engine, settings_for, shown_url

__all__ = ["register"]


def register(db: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``upgrade``, ``stats`` and ``vacuum`` to ``db``'s actions (*db*)."""
    p = with_config(db.add_parser("upgrade", help="run the broker store's and the ledger's migrations"))
    p.add_argument("--url", help="the store URL (default: the configured store.url)")
    p.set_defaults(func=cmd_db_upgrade)
    p = with_config(db.add_parser("stats", help="table sizes and rows, the oldest online document, the next purge"))
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_db_stats)
    p = with_config(db.add_parser("vacuum", help="give the space freed by purges back to the file system"))
    p.add_argument(
        "--full",
        action="store_true",
        help="SQLite: rewrite the file once to switch on incremental vacuum (the gateway stopped)",
    )
    p.add_argument("--force", action="store_true", help="with --full: even though gateway processes seem to run")
    p.add_argument("--pages", type=int, default=None, metavar="N", help="give back at most N pages")
    p.set_defaults(func=cmd_db_vacuum)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from broker_core.sql import make_engine, upgrade_database
    from gateway.delivery.records import upgrade_deliveries
    from gateway.ledger.records import upgrade_ledger

    url = args.url or os.environ.get("B2BGW_STORE_URL") or settings_for(args).store_url
    if not url.startswith(("sqlite:", "postgresql")):
        raise CommandError(
            f"{shown_url(url)}: only SQL stores have migrations; give a sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB URL"
        )
    broker_revision = upgrade_database(url)
    engine = make_engine(url)
    try:
        ledger_revision = upgrade_ledger(engine)
        upgrade_deliveries(engine)
    finally:
        engine.dispose()
    print(f"broker tables at revision {broker_revision}, ledger tables at revision {ledger_revision}")
    return 0


def cmd_db_stats(args: argparse.Namespace) -> int:
    from gateway.ledger import stats as store_stats

    settings = settings_for(args)
    engine = existing_store_engine(settings)
    try:
        stats = store_stats.db_stats(engine, settings.retention)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
    else:
        print(store_stats.format_stats(stats))
    return 0


def cmd_db_vacuum(args: argparse.Namespace) -> int:
    from gateway.ledger import stats as store_stats
    from ledger_contract import space as store_space

    settings = settings_for(args)
    engine = existing_store_engine(settings)
    try:
        pg = engine.dialect.name == "postgresql"
        if pg:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                for table in ("b2b_ledger", "b2b_ledger_events", "b2b_ledger_tombstones"):
                    conn.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
            print(
                "PostgreSQL: VACUUM (ANALYZE) of the ledger's tables done (autovacuum does the same on its own; "
                "the space is reused by new rows, not given back to the file system)"
            )
            return 0
        space = store_space.sqlite_space(engine)
        if args.full:
            alive = store_stats.live_instances(engine)
            if alive and not args.force:
                raise CommandError(
                    f"{alive} gateway process(es) use this store (heartbeats within 30 s): stop them "
                    "first (VACUUM holds the write lock while it rewrites the whole file), or pass "
                    "--force"
                )
            engine.dispose()
            done = store_space.full_vacuum(settings.store_url.split("?", 1)[0])
            print(
                f"rewrote {space['file']}: {done['before']:,} -> {done['after']:,} bytes; auto_vacuum is now "
                f"{ {0: 'none', 1: 'full', 2: 'incremental'}.get(done['auto_vacuum'], done['auto_vacuum']) }"
            )
            return 0
        if space["auto_vacuum"] != "incremental":
            print(
                f"{space['file']}: auto_vacuum is {space['auto_vacuum']}: its {space['free_pages']:,} free pages "
                f"({space['free_bytes']:,} bytes) are reused by new documents but cannot be given back a few at a "
                "time; run `b2bgw db vacuum --full` once, with the gateway stopped, to switch to incremental vacuum"
            )
            return 0
    finally:
        engine.dispose()
    from gateway.runtime.serving import open_broker
    from spark_etl.archive import store_writer

    broker = open_broker(settings, sweep_interval=0)
    try:
        freed = store_space.vacuum(broker.engine, store_writer(broker, durable=False), max_pages=args.pages)
        after = store_space.sqlite_space(broker.engine)
    finally:
        broker.close()
    print(
        f"gave {freed:,} free pages ({freed * after['page_size']:,} bytes) back; the file is cut to size at the "
        f"next checkpoint; {after['free_pages']:,} free pages left"
    )
    return 0
