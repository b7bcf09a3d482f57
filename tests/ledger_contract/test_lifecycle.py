"""ledger_contract.lifecycle: the purge's pacing. Due documents, the purge and the journal are tested with the
archive job (tests/spark_etl/test_archive.py) and the gateway's answers after it (tests/gateway/test_retention.py)."""

from __future__ import annotations

import time

from ledger_contract.lifecycle import Pacer


def test_pacer_yields_the_write_turn_to_a_busy_store():
    """A purge transaction that had to wait for the turn (the intake is busy) is followed by a pause nine
    times as long as it ran: it takes a tenth of the turn; on a quiet store a quarter as long."""
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
        assert (pacer.busy == 10) is want_busy
        own = 10 * 0.004
        if want_busy:
            assert took >= own + 10 * 0.02 + 9 * 9 * 0.004  # nine pauses of nine times its own time
        else:
            assert took < own + 9 * 0.004 * 2 + 0.05
