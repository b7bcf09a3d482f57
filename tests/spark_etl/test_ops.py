"""The lock (one runner among several processes), the nightly scheduler, the
command line (``etl run``, ``etl status``, ``register``) and PostgreSQL."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import threading
import time

import pytest
import sqlalchemy as sa
from etltest import INVOICE, ORDER, ORDER_CHANGE, Ledger, example, race_worker, table

from spark_etl import cli, config, job, state
from spark_etl.config import EtlSettingError
from spark_etl.scheduler import JOB_ID, NightlyLoad

# --------------------------------------------------------------------------- lock


def test_lease_is_exclusive_renewable_and_expires(ledger):
    engine = state.open_store(ledger.url)
    a = state.Lease(engine, ttl=0.6, owner="a")
    b = state.Lease(engine, ttl=0.6, owner="b")
    assert a.acquire()
    assert not b.acquire()
    time.sleep(1.0)  # a's heartbeat (every ttl/3) keeps it alive
    assert not b.acquire() and not a.lost
    a._stop.set()  # a dies without releasing: no more renewals
    time.sleep(1.0)
    assert b.acquire()  # the lease expired
    assert not a.renew() and a.lost  # a notices it lost the lock
    b.release()
    assert a.acquire()
    a.release()
    engine.dispose()


def test_two_schedulers_racing_run_the_night_exactly_once(ledger):
    """Two gateway processes' NightlyLoads fire at the same slot at the same
    time: exactly one runs the job; a third firing late for the same slot (a
    misfire within the grace time) does not run it again; the next night runs."""
    calls: list[str] = []
    barrier = threading.Barrier(2)

    def runner(settings, db_url, *, lease):
        calls.append(lease.owner)
        time.sleep(0.5)  # still running while the other one tries
        return "ok"

    loads = [NightlyLoad({}, ledger.url, runner=runner) for _ in range(3)]
    slot = loads[0].current_slot(dt.datetime(2026, 11, 22, 2, 0, 5, tzinfo=dt.UTC))
    assert slot == int(dt.datetime(2026, 11, 22, 2, 0, tzinfo=dt.UTC).timestamp() * 1000)
    results: dict[int, bool] = {}

    def fire(i: int) -> None:
        barrier.wait()
        results[i] = loads[i].run_scheduled(slot)

    threads = [threading.Thread(target=fire, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results.values()) == [False, True]
    assert len(calls) == 1
    assert loads[2].run_scheduled(slot) is False  # late, same night: already done
    assert len(calls) == 1
    assert loads[2].run_scheduled(slot + 86_400_000) is True  # the next night
    assert len(calls) == 2


def test_two_processes_racing_for_the_lock(ledger):
    state.open_store(ledger.url).dispose()
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0
    procs = [ctx.Process(target=race_worker, args=(ledger.url, 1234, start_at, out)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert sorted(results) == [False, False, True]


def test_scheduler_uses_a_cron_trigger_with_misfire_handling(ledger):
    load = NightlyLoad({"schedule": "30 3 * * *", "timezone": "Europe/Stockholm", "misfire_grace_time": 900},
                       ledger.url, runner=lambda *a, **k: None)  # fmt: skip
    load.start()
    try:
        j = load.scheduler.get_job(JOB_ID)
        assert (j.misfire_grace_time, j.coalesce, j.max_instances) == (900, True, 1)
        nxt = load.next_run_time()
        assert (nxt.hour, nxt.minute, str(nxt.tzinfo)) == (3, 30, "Europe/Stockholm")
    finally:
        load.stop()
    disabled = NightlyLoad({"enabled": False}, ledger.url)
    disabled.start()
    assert disabled.scheduler is None
    with pytest.raises(ValueError, match="unknown etl setting"):
        NightlyLoad({"shedule": "0 2 * * *"}, ledger.url)
    with pytest.raises(EtlSettingError, match="crontab") as info:  # not a scheduler's error at start-up
        NightlyLoad({"schedule": "at two"}, ledger.url)
    assert info.value.key == "schedule"


def test_a_busy_lock_refuses_a_hand_run(spark, ledger, settings):
    engine = state.open_store(ledger.url)
    holder = state.Lease(engine, ttl=60, owner="nightly")
    assert holder.acquire()
    try:
        with pytest.raises(job.LockBusyError):
            job.run(settings, ledger.url, spark=spark)
    finally:
        holder.release()
        engine.dispose()


# --------------------------------------------------------------------------- command line


def test_register_adds_etl_run_and_status():
    parser = argparse.ArgumentParser(prog="b2bgw")
    parser.add_argument("--config", "-c")
    sub = parser.add_subparsers(dest="command")
    cli.register(sub)
    args = parser.parse_args(["etl", "run", "--full", "--since", "2026-11-01", "--config", "x.yaml", "--db-url", "u"])
    assert (args.func, args.full, args.since, args.etl_config, args.etl_db_url) == (
        cli.cmd_run,
        True,
        "2026-11-01",
        "x.yaml",
        "u",
    )
    args = parser.parse_args(["-c", "gw.yaml", "etl", "status"])
    assert args.func is cli.cmd_status and args.config == "gw.yaml" and args.etl_config is None


def test_settings_come_from_the_gateway_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv("B2BGW_STORE_URL", raising=False)
    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    cfg = tmp_path / "b2bgw.yaml"
    cfg.write_text("store:\n  url: sqlite:///x.db\netl:\n  schedule: '15 1 * * *'\n  warehouse: /w\n")
    settings, url = config.load_settings(cfg)
    assert (url, settings["schedule"], settings["warehouse"], settings["spark_master"], settings["timezone"]) == (
        "sqlite:///x.db",
        "15 1 * * *",
        "/w",
        "local[2]",
        "UTC",
    )
    monkeypatch.chdir(tmp_path)  # no config/b2bgw.yaml here: the defaults
    assert config.load_settings() == (config.DEFAULTS, config.DEFAULT_DB_URL)


def test_cli_run_and_status(spark, ledger, settings, capsys):
    ledger.add("o1", "Order", example(ORDER))
    ledger.add("bad", "Invoice", b"<Invoice>")
    argv = ["--db-url", ledger.url, "--warehouse", settings["warehouse"], "--no-progress"]
    assert cli.main(["run", *argv]) == 0
    out = capsys.readouterr().out
    assert "succeeded" in out and "2 documents read, 1 loaded, 1 quarantined" in out and "quarantined bad" in out

    assert cli.main(["status", "--db-url", ledger.url, "--quarantine"]) == 0
    out = capsys.readouterr().out.splitlines()
    with ledger.engine.connect() as conn:
        wm = state.watermark(conn)
    assert out[0] == f"watermark (ledger event seq): {wm}; quarantined documents: 1"
    assert out[1].split() == ["run", "mode", "outcome", "started", "(UTC)", "ended", "(UTC)", "read", "written",
                              "watermark", "error"]  # fmt: skip
    row = out[2].split()
    assert (row[0], row[1], row[2], row[7], row[8], row[9]) == ("1", "incremental", "succeeded", "2", "3", f"0->{wm}")
    assert any(line.strip().startswith("bad  Invoice  ACME  run 1: not well-formed") for line in out)

    assert cli.main(["status", "--db-url", ledger.url, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["watermark"] == wm and data["runs"][0]["status"] == "succeeded"
    assert data["runs"][0]["rows_written"] == 3 and data["runs"][0]["error"] is None


# --------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg_ledger(postgres_schema):
    from broker_core.sql import make_engine

    led = Ledger.__new__(Ledger)
    led.url = postgres_schema
    led.engine = make_engine(postgres_schema)
    from ledger_contract.tables import metadata

    metadata.create_all(led.engine)
    led.at = 1_790_000_000_000
    yield led
    led.engine.dispose()


@pytest.mark.postgres
def test_load_from_postgresql(spark, pg_ledger, settings):
    pg_ledger.add("o1", "Order", example(ORDER))
    pg_ledger.add("i1", "Invoice", example(INVOICE))
    r = job.run(settings, pg_ledger.url, spark=spark)
    assert (r.status, r.docs_read, r.loaded) == ("succeeded", 2, 2)
    pg_ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    r = job.run(settings, pg_ledger.url, spark=spark)
    assert (r.docs_read, r.loaded) == (1, 1)
    (o,) = table(settings, "fact_order")
    assert (o["status"], o["order_id"]) == ("changed", "34")
    assert len(table(settings, "fact_invoice_line")) == 5
    with pg_ledger.engine.connect() as conn:
        names = set(sa.inspect(conn).get_table_names())
        assert {"etl_runs", "etl_quarantine", "etl_lock", "b2b_etl_version"} <= names
        assert state.watermark(conn) == r.seq_to


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux CPU affinity and at least two CPUs",
)
def test_a_pinned_serving_process_starts_the_jvm_on_every_cpu(monkeypatch):
    """``b2bgw serve --processes N`` binds each serving process to one CPU and names them all in
    B2BGW_CPUS; the thread that starts Spark's JVM (which inherits its CPU set) takes them all back."""
    from spark_etl.session import _unpin_for_jvm

    every = os.sched_getaffinity(0)
    monkeypatch.setenv("B2BGW_CPUS", ",".join(map(str, sorted(every))))
    seen = {}

    def pinned_thread() -> None:  # a thread's CPU set is its own: the test's thread is left alone
        os.sched_setaffinity(0, {min(every)})
        seen["before"] = os.sched_getaffinity(0)
        _unpin_for_jvm()
        seen["after"] = os.sched_getaffinity(0)

    t = threading.Thread(target=pinned_thread)
    t.start()
    t.join()
    assert seen == {"before": {min(every)}, "after": every}
