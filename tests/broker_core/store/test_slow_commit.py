"""Slow commits are logged with where the time went: the operator reading the
warning learns whether another process held the write turn, the operations
were slow, or the COMMIT itself (the disk's sync) was."""

from __future__ import annotations

import contextlib
import logging
import re
import time

import pytest
import sqlalchemy as sa

from broker_core import Broker, InvalidArgumentError
from broker_core._sql._writer import GroupCommitter


def _committer(slow: float, serialize=None) -> GroupCommitter:
    engine = sa.create_engine("sqlite://")  # in memory: no disk whose sync could be slow itself
    return GroupCommitter(engine, begin=lambda conn, durable: None, slow_commit=slow, serialize=serialize)


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "broker_core._sql._writer" and r.levelno == logging.WARNING and "slow commit" in r.getMessage()
    ]


def _parts(message: str) -> dict[str, int]:
    found = re.search(
        r"took (\d+) ms: (\d+) ms waiting for the write turn .*?, (\d+) ms running the operations, "
        r"(\d+) ms in COMMIT",
        message,
    )
    assert found, message
    return dict(zip(("took", "turn", "ops", "commit"), map(int, found.groups()), strict=False))


def test_a_slow_operation_is_reported_as_such(caplog):
    caplog.set_level(logging.WARNING, "broker_core._sql._writer")
    writer = _committer(slow=0.1)
    try:
        writer.submit(lambda batch: time.sleep(0.2))
        writer.submit(lambda batch: None)  # a quick one is not
    finally:
        writer.close()
    [message] = _warnings(caplog)
    parts = _parts(message)
    assert "1 operations" in message
    assert parts["took"] >= 200 and parts["ops"] >= 200
    assert parts["turn"] < 50 and parts["commit"] < 50
    assert writer.slow_commits == 1
    assert writer.slowest_commit >= 0.2


def test_waiting_for_the_write_turn_is_told_apart(caplog):
    caplog.set_level(logging.WARNING, "broker_core._sql._writer")

    @contextlib.contextmanager
    def busy_turn():
        time.sleep(0.2)  # another process holds it
        yield

    writer = _committer(slow=0.1, serialize=busy_turn)
    try:
        writer.submit(lambda batch: None)
    finally:
        writer.close()
    [message] = _warnings(caplog)
    parts = _parts(message)
    assert parts["turn"] >= 200
    assert parts["ops"] < 50 and parts["commit"] < 50


def test_zero_turns_the_warning_off(caplog):
    caplog.set_level(logging.WARNING, "broker_core._sql._writer")
    writer = _committer(slow=0)
    try:
        writer.submit(lambda batch: time.sleep(0.06))
    finally:
        writer.close()
    assert _warnings(caplog) == []
    assert writer.slow_commits == 0


def test_the_store_option_reaches_the_writer(tmp_path, caplog):
    caplog.set_level(logging.WARNING, "broker_core._sql._writer")
    with Broker.open(f"sqlite:///{tmp_path / 'b.db'}", slow_commit_warning=0.05) as broker:
        writer = broker.store._writer
        assert writer.slow_commit == 0.05
        writer.submit(lambda batch: time.sleep(0.08))
        assert writer.slow_commits >= 1
    assert _warnings(caplog)


@pytest.mark.parametrize("value", [-1, -0.01])
def test_a_negative_threshold_is_refused(tmp_path, value):
    with pytest.raises(InvalidArgumentError, match="slow_commit_warning"):
        Broker.open(f"sqlite:///{tmp_path / 'b.db'}", slow_commit_warning=value)
