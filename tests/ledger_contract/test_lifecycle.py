"""ledger_contract.lifecycle: the purge's pacing. Due documents, the purge and the journal are tested with the
archive job (tests/spark_etl/test_archive.py) and the gateway's answers after it (tests/gateway/ledger/test_retention.py).

The pacer reads time from an injected clock and pauses through an injected sleep: here a fake clock that the
fake store's work and waits advance, so every pause is checked exactly, on any machine."""

from __future__ import annotations

import pytest

from ledger_contract.lifecycle import Pacer

WORK = 0.004  # what one chunk's transaction runs


class FakeTime:
    """A clock that moves only when the test says: work, waits for the write turn, and the pacer's pauses."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def pacer(self, **kwargs) -> Pacer:
        return Pacer(first=10, most=10, least=10, clock=self.clock, sleep=self.sleep, **kwargs)

    def work(self, conn, chunk) -> int:
        self.now += WORK
        return len(chunk)


@pytest.mark.parametrize("busy", [False, True])
def test_pacer_yields_the_write_turn_to_a_busy_store(busy):
    """A purge transaction that had to wait for the turn (the intake is busy), as the one before it did, is
    followed by a pause nine times as long as it took (its wait included): it takes a tenth of the time;
    on a quiet store a pause a quarter as long as it ran."""
    fake = FakeTime()

    def write(fn):
        if busy:
            fake.now += 0.02  # the turn is held by other commits first
        return fn(None)

    pacer = fake.pacer()
    assert sum(pacer.run(write, fake.work, list(range(100)))) == 100
    assert len(fake.pauses) == 9  # between ten transactions, none after the last
    if busy:
        assert pacer.busy == 9  # of ten transactions: the first wait alone does not count
        assert fake.pauses[0] == pytest.approx(WORK * 0.25)
        assert fake.pauses[1:] == pytest.approx([9 * (WORK + 0.02)] * 8)
    else:
        assert pacer.busy == 0
        assert fake.pauses == pytest.approx([WORK * 0.25] * 9)


@pytest.mark.parametrize("others_write", [True, False])
def test_pacer_yields_while_others_write_though_the_turn_is_free(others_write):
    """The intake's short commits seldom make a purge transaction wait: ``activity()`` (the ledger's newest
    event) rising between transactions marks the store busy all the same; unchanged, the purge runs on."""
    fake = FakeTime()
    ticks = iter(range(1000))
    activity = (lambda: next(ticks)) if others_write else (lambda: 7)
    pacer = fake.pacer(activity=activity)
    assert sum(pacer.run(lambda fn: fn(None), fake.work, list(range(50)))) == 50
    assert pacer.busy == (5 if others_write else 0)
    want = 9 * WORK if others_write else 0.25 * WORK
    assert fake.pauses == pytest.approx([want] * 4)


def test_pacer_does_not_take_one_slow_transaction_for_a_busy_store():
    """A transaction delayed once (this process's own work held it up) is not a busy store: no long pause."""
    fake = FakeTime()
    calls = [0]

    def write(fn):
        calls[0] += 1
        if calls[0] % 3 == 0:
            fake.now += 0.05
        return fn(None)

    pacer = fake.pacer()
    assert sum(pacer.run(write, fake.work, list(range(90)))) == 90
    assert pacer.busy == 0
    assert fake.pauses == pytest.approx([0.25 * WORK] * 8)


def test_pacer_sizes_transactions_to_the_target():
    """Chunks grow or shrink so one transaction runs about ``target`` seconds, within ``least`` and ``most``."""
    fake = FakeTime()
    sizes = []

    def work(conn, chunk):
        sizes.append(len(chunk))
        fake.now += 0.0001 * len(chunk)  # 0.1 ms an item: 100 items make the 10 ms target
        return len(chunk)

    pacer = Pacer(first=10, most=1000, least=5, clock=fake.clock, sleep=fake.sleep)
    assert sum(pacer.run(lambda fn: fn(None), work, list(range(1000)))) == 1000
    assert sizes[0] == 10 and sizes[1:4] == [100, 100, 100]
