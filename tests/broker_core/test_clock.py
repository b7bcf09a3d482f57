"""broker_core.clock: epoch milliseconds and their ISO-8601 UTC form."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from broker_core.clock import iso_ms, now_ms


@pytest.mark.parametrize(
    "epoch_ms, text",
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_710_408_600_123, "2024-03-14T09:30:00.123Z"),
        (1_710_408_600_999, "2024-03-14T09:30:00.999Z"),
        (1_710_408_601_000, "2024-03-14T09:30:01.000Z"),
        (951_782_400_007, "2000-02-29T00:00:00.007Z"),
    ],
)
def test_iso_ms_formats_utc_with_milliseconds(epoch_ms: int, text: str) -> None:
    assert iso_ms(epoch_ms) == text


def test_iso_ms_of_none_is_none() -> None:
    assert iso_ms(None) is None


def test_iso_ms_agrees_with_datetime_across_seconds() -> None:
    # Consecutive values cross second boundaries back and forth, so the cached second must follow.
    for epoch_ms in [5_000_999, 5_001_000, 5_000_500, 86_399_999, 86_400_000, 1_700_000_000_001, 5_000_999]:
        expected = dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC)
        parsed = dt.datetime.strptime(iso_ms(epoch_ms), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
        assert parsed == expected.replace(microsecond=(epoch_ms % 1000) * 1000)


def test_iso_ms_from_many_threads() -> None:
    values = [1_700_000_000_000 + i * 733 for i in range(2000)]
    wrong: list[int] = []

    def check() -> None:
        for v in values:
            if (
                iso_ms(v)
                != dt.datetime.fromtimestamp(v // 1000, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{v % 1000:03d}Z"
            ):
                wrong.append(v)

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_now_ms_is_the_wall_clock_in_milliseconds() -> None:
    before = time.time()
    now = now_ms()
    after = time.time()
    assert int(before * 1000) <= now <= int(after * 1000)
