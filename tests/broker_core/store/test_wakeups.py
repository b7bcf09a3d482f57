"""broker_core._sql._wakeups: the datagrams SQLite processes of one host wake each other with."""

from __future__ import annotations

import os

import pytest

from broker_core._sql._wakeups import LocalWakeups, supported

pytestmark = pytest.mark.skipif(not supported(), reason="wake-up datagrams use Linux abstract sockets")


@pytest.fixture
def pair():
    tag = os.urandom(4).hex()
    a, b = LocalWakeups(f"test-a-{tag}"), LocalWakeups(f"test-b-{tag}")
    yield a, b
    a.close()
    b.close()


def test_boxes_reach_the_peer_and_queued_datagrams_are_drained_at_once(pair):
    a, b = pair
    a.set_peers([b.instance_id, a.instance_id])  # itself is never a peer
    assert a.peers == [b.instance_id]
    a.boxes_available({"queue:orders"})
    a.boxes_available({"queue:invoices", "topic:news|sub"})
    assert b.receive(1.0) == {"queue:orders", "queue:invoices", "topic:news|sub"}
    assert b.receive(0.01) == set()  # nothing left: both datagrams were drained by the first call


def test_a_hello_makes_the_sender_a_peer(pair):
    a, b = pair
    b.set_peers([a.instance_id])
    assert a.peers == []
    b.announce()
    assert a.receive(1.0) == set()
    assert a.peers == [b.instance_id]


def test_too_many_boxes_say_everything(pair):
    a, b = pair
    a.set_peers([b.instance_id])
    a.boxes_available(f"queue:q{i:05d}" for i in range(2000))
    assert b.receive(1.0) == {"*"}


def test_a_gone_peer_is_forgotten_and_sending_never_raises(pair):
    a, _ = pair
    a.set_peers(["no-such-process-" + os.urandom(4).hex()])
    a.boxes_available({"queue:orders"})
    assert a.peers == []
