"""The one wall clock of the broker, the ledger and the ETL: epoch
milliseconds, and their ISO-8601 UTC form.

Every timestamp these packages store (``b2b_entries``, the ledger, the ETL's
runs and leases) is epoch milliseconds from :func:`now_ms`; every timestamp
they show or log is :func:`iso_ms` of one, ``2024-03-14T09:30:00.123Z``:
sortable as text, millisecond precision, always UTC, the same form as the
gateway's log records and receipts.
"""

from __future__ import annotations

import time
from typing import overload

__all__ = ["iso_ms", "now_ms"]


def now_ms() -> int:
    """Now, in milliseconds since the epoch."""
    return int(time.time() * 1000)


#: The last second formatted: (epoch seconds, "YYYY-MM-DDTHH:MM:SS"). Timestamps come in runs within one
#: second (a page of messages, a burst of log records): strftime once per second. One tuple, swapped whole,
#: so threads never see half of an update.
_last_second: tuple[int, str] = (-1, "")


@overload
def iso_ms(epoch_ms: int) -> str: ...
@overload
def iso_ms(epoch_ms: None) -> None: ...
def iso_ms(epoch_ms: int | None) -> str | None:
    """``2024-03-14T09:30:00.123Z`` from epoch milliseconds (``None`` stays ``None``)."""
    global _last_second
    if epoch_ms is None:
        return None
    seconds, ms = divmod(int(epoch_ms), 1000)
    last = _last_second
    if last[0] != seconds:
        last = _last_second = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{last[1]}.{ms:03d}Z"
