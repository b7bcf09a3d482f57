"""Reads of partners' data audited: who opened which document or message, from where.

A document's content is a partner's business data; reading it is an act worth a trace as much as a replay
is. The admin API's and the console's document and message views record ``read-document`` (target: the
message id; detail: what was shown) and ``read-message`` (target: the destination; message id listed).
Lists and searches, which show ids and statuses, not content, are not recorded.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["audit_read"]


async def audit_read(
    service: Any,
    principal: Any,
    action: str,
    target: str,
    client: str,
    *,
    detail: str | None = None,
    message_ids: list[str] | None = None,
) -> None:
    """Record that *principal* read *target* (``read-document`` or ``read-message``)."""
    await asyncio.to_thread(
        lambda: service.audit.record(
            operator=principal.name,
            role=principal.role,
            action=action,
            target=target,
            detail=detail,
            message_ids=message_ids,
            client=client,
        )
    )
