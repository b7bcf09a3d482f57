"""The writer's commit delay: while asynchronous sends stream in, a commit
waits ``commit_delay`` for more of them, so that one commit (one fsync)
carries them all; a caller that blocks on its own send never waits for it,
and a stream that pauses for a quarter of the delay ends the wait.

Each store operation sees the number of the transaction it runs in
(``Batch.number``), which is how these tests tell what shared a commit."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import sqlalchemy as sa

from broker_core import Broker, InvalidArgumentError, Queue
from broker_core._sql._writer import GroupCommitter


def _committer(tmp_path, delay: float) -> GroupCommitter:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'w.db'}")
    return GroupCommitter(engine, begin=lambda conn, durable: None, commit_delay=delay)


def _stream(writer: GroupCommitter, gaps: list[float]) -> tuple[dict[str, int], dict[str, float]]:
    """A stream: "a" (its transaction held until "b" is queued behind it), then "b" and one more
    operation after each gap; every operation's transaction number and when it was committed."""
    numbers: dict[str, int] = {}
    committed: dict[str, float] = {}
    done = threading.Semaphore(0)
    first_running = threading.Event()
    release_first = threading.Event()

    def op(name, block=False):
        def run(batch):
            numbers[name] = batch.number
            if block:
                first_running.set()
                release_first.wait(5)

        return run

    def callback(name):
        def settle(result, error):
            assert error is None
            committed[name] = time.monotonic()
            done.release()

        return settle

    writer.submit(op("a", block=True), callback=callback("a"))
    assert first_running.wait(5)
    committed["start"] = time.monotonic()
    writer.submit(op("b"), callback=callback("b"))  # queued while "a"'s transaction runs: a stream
    release_first.set()
    for i, gap in enumerate(gaps):
        time.sleep(gap)
        writer.submit(op(f"s{i}"), callback=callback(f"s{i}"))
    for _ in range(len(gaps) + 2):
        assert done.acquire(timeout=10)
    return numbers, committed


def test_asynchronous_operations_arriving_within_the_delay_share_one_commit(tmp_path):
    writer = _committer(tmp_path, delay=1.0)
    try:
        # 0.1 s after "b": well inside the delay that follows "a"'s commit, and its quiet spell (0.25 s)
        numbers, _ = _stream(writer, gaps=[0.1, 0.0])
    finally:
        writer.close()
    assert numbers["b"] == numbers["s0"] == numbers["s1"] == numbers["a"] + 1


def _pair_after(writer: GroupCommitter, warm_up_gap: float | None, count: int = 40) -> tuple[int, int]:
    """Submit ``count`` asynchronous operations ``warm_up_gap`` apart (none if
    None), wait until they are committed and the writer is idle, then submit
    "x" and, 50 ms later, "y": the transaction numbers of x and y."""
    numbers: dict[str, int] = {}
    done = threading.Semaphore(0)

    def op(name):
        def run(batch):
            numbers[name] = batch.number

        return run

    def callback(result, error):
        assert error is None
        done.release()

    warm = 0 if warm_up_gap is None else count
    for i in range(warm):
        writer.submit(op(f"w{i}"), callback=callback)
        time.sleep(warm_up_gap)
    for _ in range(warm):
        assert done.acquire(timeout=5)
    writer.submit(op("x"), callback=callback)  # nothing queued: not a stream by the queue's measure
    time.sleep(0.05)
    writer.submit(op("y"), callback=callback)
    assert done.acquire(timeout=5) and done.acquire(timeout=5)
    return numbers["x"], numbers["y"]


def test_a_dense_stream_of_asynchronous_operations_shares_commits_even_when_the_queue_ran_dry(tmp_path):
    # gaps of 10 ms under a 1 s delay: more are due within it, so the writer waits for them
    writer = _committer(tmp_path, delay=1.0)
    try:
        x, y = _pair_after(writer, warm_up_gap=0.01)
    finally:
        writer.close()
    assert x == y


def test_sparse_asynchronous_operations_are_committed_without_waiting(tmp_path):
    # the same pair with no dense history: "x" is committed before "y" comes
    writer = _committer(tmp_path, delay=1.0)
    try:
        x, y = _pair_after(writer, warm_up_gap=None)
    finally:
        writer.close()
    assert y > x


def test_a_stream_that_pauses_is_committed_without_waiting_out_the_delay(tmp_path):
    # delay 4 s, so the quiet spell is 1 s: "b" is committed about 1 s after the stream stopped
    writer = _committer(tmp_path, delay=4.0)
    try:
        numbers, committed = _stream(writer, gaps=[])
    finally:
        writer.close()
    waited = committed["b"] - committed["start"]
    assert numbers["b"] == numbers["a"] + 1
    assert 0.5 < waited < 3.0, f"the pause ended the delay after {waited:.2f} s (quiet spell 1 s, delay 4 s)"


def test_a_stream_that_keeps_coming_is_held_until_the_delay_is_over(tmp_path):
    # gaps of 0.1 s under a 1.2 s delay (quiet spell 0.3 s): one commit takes the first ~1.2 s of
    # the stream, later ones the rest
    writer = _committer(tmp_path, delay=1.2)
    try:
        numbers, _ = _stream(writer, gaps=[0.1] * 20)
    finally:
        writer.close()
    first = numbers["b"]
    assert numbers["s0"] == numbers["s1"] == numbers["s2"] == first  # within the delay, no pause
    assert sum(numbers[f"s{i}"] == first for i in range(20)) >= 5  # about 1.2 s of it
    assert numbers["s19"] > first  # the delay is a bound: the stream did not all wait for one commit


def test_without_a_delay_the_next_transaction_starts_at_once(tmp_path):
    writer = _committer(tmp_path, delay=0.0)
    numbers: dict[str, int] = {}
    first_running = threading.Event()
    release_first = threading.Event()
    done = threading.Semaphore(0)

    def run_a(batch):
        numbers["a"] = batch.number
        first_running.set()
        release_first.wait(5)

    try:
        writer.submit(run_a, callback=lambda r, e: done.release())
        assert first_running.wait(5)
        writer.submit(lambda batch: numbers.__setitem__("b", batch.number), callback=lambda r, e: done.release())
        release_first.set()
        assert done.acquire(timeout=5) and done.acquire(timeout=5)  # "b" committed without "c"
        writer.submit(lambda batch: numbers.__setitem__("c", batch.number))
    finally:
        writer.close()
    assert numbers["c"] > numbers["b"] > numbers["a"]


def test_callers_blocked_on_their_own_operation_never_wait_for_the_delay(tmp_path):
    writer = _committer(tmp_path, delay=2.0)
    try:
        started = time.monotonic()

        def blocking_caller():
            for _ in range(10):
                writer.submit(lambda batch: batch.conn.exec_driver_sql("SELECT 1").scalar())

        threads = [threading.Thread(target=blocking_caller) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        elapsed = time.monotonic() - started
    finally:
        writer.close()
    assert elapsed < 1.0, f"30 synchronous operations took {elapsed:.2f} s: they waited for the commit delay"


def _after_a_waiting_stream(tmp_path, submit_c) -> tuple[dict[str, int], float]:
    """ "a" committed, "b" streamed in after it, the writer waiting (5 s delay) for more of the stream:
    then ``submit_c(writer, op)`` submits "c" and returns once it is committed. The transaction numbers, and
    how long "c" took."""
    writer = _committer(tmp_path, delay=5.0)
    numbers: dict[str, int] = {}
    first_running = threading.Event()
    release_first = threading.Event()

    def run_a(batch):
        numbers["a"] = batch.number
        first_running.set()
        release_first.wait(5)

    try:
        writer.submit(run_a, wait=False)
        assert first_running.wait(5)
        writer.submit(lambda batch: numbers.__setitem__("b", batch.number), wait=False)  # a stream
        release_first.set()
        time.sleep(0.1)  # the writer now waits for more of the stream
        started = time.monotonic()
        submit_c(writer, lambda batch: numbers.__setitem__("c", batch.number))
        waited = time.monotonic() - started
    finally:
        writer.close()
    return numbers, waited


def test_a_blocking_caller_ends_the_delay_and_joins_the_waiting_stream(tmp_path):
    numbers, waited = _after_a_waiting_stream(tmp_path, lambda writer, op: writer.submit(op))
    assert waited < 1.0, f"a blocking submit waited {waited:.2f} s for the commit delay"
    assert numbers["b"] == numbers["c"] == numbers["a"] + 1


def test_an_awaited_callback_ends_the_delay_like_a_blocking_caller(tmp_path):
    """An event loop's claim: submitted with a callback, but someone waits for it."""

    def submit_awaited(writer, op):
        settled = threading.Event()
        writer.submit(op, callback=lambda result, error: settled.set(), awaited=True)
        assert settled.wait(5)

    numbers, waited = _after_a_waiting_stream(tmp_path, submit_awaited)
    assert waited < 1.0, f"an awaited operation waited {waited:.2f} s for the commit delay"
    assert numbers["b"] == numbers["c"] == numbers["a"] + 1


def test_a_synchronous_send_does_not_wait_and_a_stream_of_async_sends_arrives_whole_and_in_order(tmp_path):
    queue = Queue("delay.stream")
    with Broker.open(f"sqlite:///{tmp_path / 'd.db'}", sweep_interval=0, commit_delay=0.05) as broker:
        connection = broker.connect()
        session = connection.create_session()
        producer = session.create_producer(None)
        started = time.monotonic()
        for i in range(20):
            producer.send(queue, session.create_text_message(f"sync-{i}"))
        assert time.monotonic() - started < 0.05 * 20 / 2  # no send waited for the delay

        async def stream():
            await asyncio.gather(
                *(producer.send_async(queue, session.create_text_message(f"async-{i}")) for i in range(200))
            )

        asyncio.run(stream())
        consumer = connection.create_session().create_consumer(queue)
        connection.start()
        got = [consumer.receive(timeout=2) for _ in range(220)]
        assert [m.text for m in got] == [f"sync-{i}" for i in range(20)] + [f"async-{i}" for i in range(200)]
        assert consumer.receive_no_wait() is None
        connection.close()


@pytest.mark.parametrize("delay", [-0.001, 0.5])
def test_a_commit_delay_out_of_range_is_refused(tmp_path, delay):
    with pytest.raises(InvalidArgumentError, match="commit_delay"):
        Broker.open(f"sqlite:///{tmp_path / 'bad.db'}", commit_delay=delay)
