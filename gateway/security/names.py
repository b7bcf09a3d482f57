"""Names that come from unauthenticated requests, as the audit trail keeps them.

A failed login's name is whatever the client typed or sent: it may be 10 KB, hold control characters, or
pose as a real operator. The audit trail keeps at most :data:`UNVERIFIED_CHARS` of it, its control
characters escaped, under the role ``unverified`` (never an operator's role), so that nobody reads it as
the act of the operator it names.
"""

from __future__ import annotations

from gateway.telemetry.log_escape import escape_controls

__all__ = ["UNVERIFIED_ROLE", "UNVERIFIED_CHARS", "unverified_name"]

UNVERIFIED_ROLE = "unverified"
UNVERIFIED_CHARS = 32


def unverified_name(name: object) -> str:
    """*name* as the audit trail records it for a request that did not authenticate."""
    text = name if isinstance(name, str) else ""
    shown = escape_controls(text[:UNVERIFIED_CHARS])
    if len(text) > UNVERIFIED_CHARS:
        shown += "..."
    return shown[:64] or "-"
