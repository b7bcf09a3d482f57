"""``b2bgw db upgrade``: the broker store's and the ledger's migrations (``db stats`` and ``db vacuum``
are in :mod:`gateway.cli.lifecycle`)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from gateway.cli.support import CommandError, settings_for, shown_url

__all__ = ["register"]


def register(db: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    """Add ``upgrade`` to ``db``'s actions (*db*)."""
    p = with_config(db.add_parser("upgrade", help="run the broker store's and the ledger's migrations"))
    p.add_argument("--url", help="the store URL (default: the configured store.url)")
    p.set_defaults(func=cmd_db_upgrade)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from broker_core.sql import make_engine, upgrade_database

    from gateway.delivery.records import upgrade_deliveries
    from gateway.ledger.records import upgrade_ledger

    url = args.url or os.environ.get("B2BGW_STORE_URL") or settings_for(args).store_url
    if not url.startswith(("sqlite:", "postgresql")):
        raise CommandError(f"{shown_url(url)}: only SQL stores have migrations; give a sqlite:///PATH or "
                           "postgresql+psycopg://USER@HOST/DB URL")
    broker_revision = upgrade_database(url)
    engine = make_engine(url)
    try:
        ledger_revision = upgrade_ledger(engine)
        upgrade_deliveries(engine)
    finally:
        engine.dispose()
    print(f"broker tables at revision {broker_revision}, ledger tables at revision {ledger_revision}")
    return 0
