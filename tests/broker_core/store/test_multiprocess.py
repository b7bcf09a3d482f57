"""Several processes on one database are one broker."""

from __future__ import annotations

import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker_core import Broker, Queue, Requestor

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("broker_core._sql") is None, reason="the SQL store is not installed"
)

WORKER = Path(__file__).with_name("mp_worker.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("postgres_schema")


def spawn(*args: str, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env_extra}
    return subprocess.Popen([sys.executable, str(WORKER), *args], env=env, stderr=subprocess.PIPE, text=True)


def wait_ready(path: Path, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not Path(str(path) + ".ready").exists():
        assert proc.poll() is None, f"worker died: {proc.stderr.read()}"
        assert time.monotonic() < deadline, "worker did not start"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return err


def test_competing_consumers_in_processes_never_share_a_message(shared_url, tmp_path):
    total = 600
    outs = [tmp_path / f"consumer{i}.txt" for i in range(3)]
    procs = [spawn("consume", shared_url, str(out), str(total)) for out in outs]
    for out, proc in zip(outs, procs, strict=False):
        wait_ready(out, proc)
    with Broker.open(shared_url, sweep_interval=0) as broker, broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(Queue("mp.work"))
        for i in range(total):
            producer.send(session.create_text_message(f"m{i}"))
    for proc in procs:
        finish(proc)
    received = [[line.split()[0] for line in out.read_text().splitlines()] for out in outs]
    everything = [key for keys in received for key in keys]
    assert sorted(everything) == sorted(f"m{i}" for i in range(total))  # each exactly once
    assert len(set(everything)) == total
    assert all(keys for keys in received), [len(k) for k in received]  # the load was shared


def wake_up_latencies(
    url: str, tmp_path: Path, count: int, consumer_env: dict[str, str] | None = None, **broker_options
) -> list[float]:
    """Milliseconds from each send's commit (in this process) to its receipt by a consumer process that
    was blocked in ``receive``; ``count`` messages, 50 ms apart."""
    out = tmp_path / "consumer.txt"
    proc = spawn("consume", url, str(out), str(count), **(consumer_env or {}))
    wait_ready(out, proc)
    sent_at = {}
    with Broker.open(url, sweep_interval=0, **broker_options) as broker, broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(Queue("mp.work"))
        time.sleep(0.5)  # the consumer is blocked in receive()
        for i in range(count):
            producer.send(session.create_text_message(f"w{i}"))
            sent_at[f"w{i}"] = time.monotonic_ns()  # after the commit: the message is visible
            time.sleep(0.05)
    finish(proc)
    latencies = sorted(
        (int(ns) - sent_at[key]) / 1e6 for key, ns in (line.split() for line in out.read_text().splitlines())
    )
    assert len(latencies) == count
    print(
        f"\ncross-process wake-up on {url.split(':')[0]}: median {statistics.median(latencies):.1f} ms, "
        f"max {latencies[-1]:.1f} ms"
    )
    return latencies


def test_a_waiting_consumer_in_another_process_wakes_at_once(shared_url, tmp_path):
    latencies = wake_up_latencies(shared_url, tmp_path, 20)
    assert statistics.median(latencies) < 50, latencies  # LISTEN/NOTIFY on PostgreSQL, datagrams on SQLite


def test_without_wake_up_datagrams_sqlite_polling_still_finds_other_processes_messages(tmp_path):
    """The safety net: a consumer process that takes no datagrams (local_wakeups off) polls every 20 ms."""
    latencies = wake_up_latencies(f"sqlite:///{tmp_path / 'poll.db'}", tmp_path, 10, {"MP_NO_WAKEUPS": "1"})
    assert statistics.median(latencies) < 100, latencies


def test_request_reply_across_processes(shared_url, tmp_path):
    out = tmp_path / "responder.txt"
    proc = spawn("respond", shared_url, str(out))
    wait_ready(out, proc)
    with Broker.open(shared_url, sweep_interval=0) as broker, broker.connect() as conn:
        session = conn.create_session()
        requestor = Requestor(session, Queue("svc"))
        replies = [requestor.request(session.create_text_message(f"q{i}"), timeout=10).text for i in range(30)]
        session.create_producer(Queue("svc")).send(session.create_text_message("stop"))
    finish(proc)
    assert replies == [f"reply to q{i} from pid {proc.pid}" for i in range(30)]


def test_processes_creating_one_sqlite_database_together_all_open_it(tmp_path):
    """Opening migrates; processes that open a new database at the same moment take turns (a file lock)
    instead of failing with "database is locked"."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    go = tmp_path / "go"
    code = (
        "import os, sys, time\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
        "from broker_core import Broker\n"
        f"Broker.open({url!r}, sweep_interval=0).close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import broker_core._sql, sqlalchemy, alembic\n" + code],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    time.sleep(1.5)  # every process imported what it needs and waits for the start
    go.touch()
    for proc in procs:
        finish(proc, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="wake-up datagrams use Linux abstract sockets")
def test_sqlite_processes_wake_each_other_without_waiting_for_the_poll(tmp_path):
    """With polling every 5 s, a consumer in another process still gets each message in milliseconds, and
    request-reply crosses processes both ways: the writer's datagram after the commit wakes it."""
    url = f"sqlite:///{tmp_path / 'wake.db'}"
    slow = {"MP_POLL_INTERVAL": "5"}
    latencies = wake_up_latencies(url, tmp_path, 20, slow, poll_interval=5.0)
    assert statistics.median(latencies) < 50 and latencies[-1] < 1000, latencies

    responder_out = tmp_path / "responder.txt"
    responder = spawn("respond", url, str(responder_out), **slow)
    wait_ready(responder_out, responder)
    with Broker.open(url, sweep_interval=0, poll_interval=5.0) as broker, broker.connect() as conn:
        session = conn.create_session()
        requestor = Requestor(session, Queue("svc"))
        started = time.monotonic()
        replies = [requestor.request(session.create_text_message(f"q{i}"), timeout=10).text for i in range(20)]
        elapsed = time.monotonic() - started
        session.create_producer(Queue("svc")).send(session.create_text_message("stop"))
    finish(responder)
    assert replies == [f"reply to q{i} from pid {responder.pid}" for i in range(20)]
    assert elapsed < 5, f"20 round trips took {elapsed:.1f} s: the poll, not the wake-ups, carried them"


def test_four_sqlite_processes_under_load_never_see_database_is_locked(tmp_path):
    url = f"sqlite:///{tmp_path / 'load.db'}"
    outs = [tmp_path / f"p{i}.txt" for i in range(4)]
    procs = [spawn("produce", url, str(out), "400", f"p{i}", "and-consume") for i, out in enumerate(outs)]
    errors = [finish(proc) for proc in procs]
    for err in errors:
        assert "database is locked" not in err
        assert "Traceback" not in err
    with Broker.open(url, sweep_interval=0) as broker, broker.connect() as conn:
        conn.start()
        consumer = conn.create_session().create_consumer(Queue("mp.load"))
        left = 0
        while consumer.receive(timeout=0.5) is not None:
            left += 1
    got = sum(int(out.read_text().split("got ")[1].split()[0]) for out in outs)
    assert got + left == 1600  # every message once, whichever process took it
