"""ledger_contract.lifecycle: the purge's pacing. Due documents, the purge and the journal are tested with the
archive job (tests/spark_etl/test_archive.py) and the gateway's answers after it (tests/gateway/ledger/test_retention.py)."""

from __future__ import annotations

import time

from ledger_contract.lifecycle import Pacer


def test_pacer_yields_the_write_turn_to_a_busy_store():
    """A purge transaction that had to wait for the turn (the intake is busy), as the one before it did, is
    followed by a pause nine times as long as it took (its wait included): it takes a tenth of the time;
    on a quiet store a pause a quarter as long as it ran."""

    def quiet(fn):
        return fn(None)

    def busy(fn):
        time.sleep(0.02)  # the turn is held by other commits first
        return fn(None)

    def work(conn, chunk):
        time.sleep(0.004)
        return len(chunk)

    for write, want_busy in ((quiet, False), (busy, True)):
        pacer = Pacer(first=10, most=10, least=10)
        t = time.perf_counter()
        assert sum(pacer.run(write, work, list(range(100)))) == 100
        took = time.perf_counter() - t
        assert pacer.busy == (9 if want_busy else 0)  # the first wait alone does not count
        own = 10 * 0.004
        if want_busy:
            assert took >= own + 10 * 0.02 + 8 * 9 * (0.004 + 0.02)  # eight pauses of nine times what it took
        else:
            assert took < own + 9 * 0.004 * 2 + 0.05


def test_pacer_yields_while_others_write_though_the_turn_is_free():
    """The intake's short commits seldom make a purge transaction wait: ``activity()`` (the ledger's newest
    event) rising between transactions marks the store busy all the same; unchanged, the purge runs on."""

    def write(fn):
        return fn(None)

    def work(conn, chunk):
        time.sleep(0.004)
        return len(chunk)

    ticks = iter(range(1000))
    for activity, want_busy in ((lambda: next(ticks), True), (lambda: 7, False)):
        pacer = Pacer(first=10, most=10, least=10, activity=activity)
        t = time.perf_counter()
        assert sum(pacer.run(write, work, list(range(50)))) == 50
        took = time.perf_counter() - t
        assert pacer.busy == (5 if want_busy else 0)
        if want_busy:
            assert took >= 5 * 0.004 + 4 * 9 * 0.004
        else:
            assert took < 5 * 0.004 + 4 * 0.25 * 0.004 * 2 + 0.05


def test_pacer_does_not_take_one_slow_transaction_for_a_busy_store():
    """A transaction delayed once (this process's own work held it up) is not a busy store: no long pause."""
    calls = [0]

    def write(fn):
        calls[0] += 1
        if calls[0] % 3 == 0:
            time.sleep(0.05)
        return fn(None)

    def work(conn, chunk):
        time.sleep(0.004)
        return len(chunk)

    pacer = Pacer(first=10, most=10, least=10)
    t = time.perf_counter()
    assert sum(pacer.run(write, work, list(range(90)))) == 90
    assert pacer.busy == 0
    assert time.perf_counter() - t < 9 * 0.004 * 1.25 + 3 * 0.05 + 0.15
