"""The command line's actions in the audit trail, beside the console's and the admin API's.

Whoever runs ``b2bgw dlq replay``, ``b2bgw archive get``, ``b2bgw archive run`` or ``b2bgw browse`` on a host
with the configuration reads partners' documents or changes what the gateway delivers, as an operator does
in the console. Each is recorded in ``b2b_audit`` under the system user running the command (role ``cli``),
with the host as the client, so the trail answers "who read or moved this" whichever door was used.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from gateway.admin.tables import audit

__all__ = ["audit_cli", "engine_writer"]

CLI_ROLE = "cli"


def _user() -> str:
    try:
        return getpass.getuser()[:64] or "unknown"
    except (KeyError, OSError):  # no name for this uid (a container)
        import os

        return f"uid {os.getuid()}"


def engine_writer(engine: sa.Engine) -> Callable[[Callable[[sa.Connection], Any]], list[Any]]:
    """A ``write(fn)`` like ``broker.write`` for commands that have an engine only."""
    from broker_core.sql import write_connection

    def write(fn: Callable[[sa.Connection], Any]) -> list[Any]:
        with write_connection(engine) as conn, conn.begin():
            return [fn(conn)]

    return write


def audit_cli(
    write: Callable[..., Any],
    action: str,
    *,
    target: str | None = None,
    count: int | None = None,
    message_ids: Sequence[str] | None = None,
    outcome: str = "done",
    detail: str | None = None,
) -> None:
    """Record the command's *action* through *write* (``broker.write`` or :func:`engine_writer`)."""
    import json
    import time

    row = {
        "at": int(time.time() * 1000),
        "operator": _user(),
        "role": CLI_ROLE,
        "action": action[:40],
        "target": target[:600] if target else None,
        "selector": None,
        "message_ids": json.dumps(list(message_ids)[:1000]) if message_ids else None,
        "count": count,
        "outcome": outcome,
        "detail": detail[:2000] if detail else None,
        "client": f"cli@{socket.gethostname()}"[:100],
    }
    write(lambda conn: conn.execute(audit.insert(), row))
