"""What the driver settles before any Spark task runs: a relative SQLite store
path (the executors work in directories of their own), a run with nothing
new (answered from SQL, no Spark), and ``-c/--config`` on the etl commands."""

from __future__ import annotations

import json
import os

import pytest
import sqlalchemy as sa
from etltest import INVOICE, ORDER, ORDER_CHANGE, Ledger, example, table
from pyspark.sql import SparkSession

from broker_core.sql import absolute_url, relative_sqlite_path
from gateway.cli import main as gateway_cli
from spark_etl import cli, job, source, state


def runs(url: str) -> list[state.RunRecord]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(reversed(state.list_runs(conn, 100)))
    finally:
        engine.dispose()


def _settings() -> dict:
    from spark_etl.config import resolve

    return resolve({"read_partitions": 2, "lock_ttl": 60})


# --------------------------------------------------------------------------- relative store paths


@pytest.mark.parametrize(
    ("url", "relative"),
    [
        ("sqlite:///var/b2bgw.db", "var/b2bgw.db"),
        ("sqlite+pysqlite:///b2bgw.db?timeout=5", "b2bgw.db"),
        ("sqlite:////srv/b2bgw.db", None),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("postgresql+psycopg://u@db/b2b?schema=s", None),
    ],
)
def test_which_store_urls_name_a_relative_file(url, relative, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert relative_sqlite_path(url) == relative
    resolved = absolute_url(url)
    if relative is None:
        assert resolved == url
    else:  # the same file, by its absolute path, options kept
        parsed = sa.engine.make_url(resolved)
        assert parsed.database == str(tmp_path / relative)
        assert dict(parsed.query) == dict(sa.engine.make_url(url).query)
        assert relative_sqlite_path(resolved) is None


def test_a_relative_store_path_loads_from_executors_in_another_directory(spark, tmp_path, monkeypatch):
    """The sample configuration's ``sqlite:///var/b2bgw.db`` is relative to
    the directory the command runs in. The Data Source's tasks run in the
    executors' working directories (here: the directory Spark started in),
    so the driver must hand them the file's absolute path."""
    driver_dir = tmp_path / "driver"
    (driver_dir / "var").mkdir(parents=True)
    monkeypatch.chdir(driver_dir)
    executor_dirs = set(spark.sparkContext.parallelize(range(2), 2).map(lambda _: os.getcwd()).collect())
    assert str(driver_dir) not in executor_dirs  # the premise: the tasks do not run where the driver does

    url = "sqlite:///var/b2bgw.db"
    ledger = Ledger(url)
    try:
        ledger.add("o1", "Order", example(ORDER))
        ledger.add("i1", "Invoice", example(INVOICE))
        ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    finally:
        ledger.engine.dispose()
    settings = {**_settings(), "warehouse": "var/warehouse", "arrow_staging": False}  # the executors read

    r = job.run(settings, url, spark=spark)
    assert (r.status, r.docs_read, r.loaded, r.quarantined) == ("succeeded", 3, 3, 0)
    assert r.stats["staging"] == "spark"
    warehouse = driver_dir / "var" / "warehouse"
    (order,) = table(warehouse, "fact_order")
    assert (order["message_id"], order["order_id"], order["status"]) == ("o1", "34", "changed")
    assert [i["message_id"] for i in table(warehouse, "fact_invoice")] == ["i1"]
    assert len(table(warehouse, "fact_invoice_line")) == 5


def test_the_data_source_refuses_a_relative_store_path_on_the_driver(spark, tmp_path, monkeypatch):
    """Handed a relative SQLite URL directly, the reader refuses it while the
    read is planned, with what to give instead, before any task opens
    another file (or none) in its own directory."""
    monkeypatch.chdir(tmp_path)
    Ledger("sqlite:///ledger.db").engine.dispose()
    df = spark.read.format("b2b_ledger").option("url", "sqlite:///ledger.db").option("ranges", "[[0, 5]]").load()
    with pytest.raises(Exception) as info:
        df.collect()
    text = str(info.value)
    assert source.RelativeStorePathError.__name__ in text
    assert "'ledger.db' relative to the current directory" in text and "absolute path" in text


# --------------------------------------------------------------------------- nothing new


class SparkStarted(Exception):
    """Raised by the patched session builder: the run tried to start Spark."""


def _refuse_spark(monkeypatch) -> None:
    """Any attempt to get or build a SparkSession raises :class:`SparkStarted`."""

    def refuse(*args, **kwargs):
        raise SparkStarted("a SparkSession was requested")

    monkeypatch.setattr("spark_etl.session.get_spark", refuse)
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", refuse)


@pytest.fixture
def no_spark(monkeypatch):
    _refuse_spark(monkeypatch)


def test_a_run_with_nothing_new_does_not_start_spark(spark, ledger, settings, monkeypatch, capsys):
    ledger.add("o1", "Order", example(ORDER))
    first = job.run(settings, ledger.url, spark=spark)
    assert (first.status, first.loaded) == ("succeeded", 1)
    before = table(settings, "fact_order")
    # new events, but no newly delivered document: a reply to a delivered one, an accepted one
    ledger.event("o1", "replied")
    ledger.add("a1", "Invoice", example(INVOICE), status="accepted")
    with ledger.engine.connect() as conn:
        newest = source.max_seq(conn)

    _refuse_spark(monkeypatch)  # from here on (the first run above needed the session)
    argv = ["run", "--db-url", ledger.url, "--warehouse", settings["warehouse"], "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"nothing new: no document was delivered in ledger seq ({first.seq_to}, {newest}]" in out
    assert "Spark not started" in out

    last = runs(ledger.url)[-1]
    assert (last.status, last.mode, last.docs_read, last.seq_from, last.seq_to) == (
        "succeeded",
        "incremental",
        0,
        first.seq_to,
        newest,
    )
    with ledger.engine.connect() as conn:
        assert state.watermark(conn) == newest
    assert table(settings, "fact_order") == before

    # a document delivered since: that run needs Spark
    ledger.event("a1", "delivered")
    with pytest.raises(SparkStarted):
        job.run(settings, ledger.url)
    assert len(runs(ledger.url)) == 2  # refused before anything was recorded


def test_an_empty_window_still_starts_spark_to_finish_an_abandoned_run(ledger, settings, no_spark):
    """A run that died before publishing is finished (its staging removed)
    by the next run, which needs the warehouse through Spark."""
    engine = state.open_store(ledger.url)
    try:
        state.start_run(engine, mode="incremental", owner="gone", seq_from=0, seq_to=0)
    finally:
        engine.dispose()
    with pytest.raises(SparkStarted):
        job.run(settings, ledger.url)


def test_a_full_rebuild_is_never_skipped(ledger, settings, no_spark):
    """``--full`` rewrites the warehouse from the ledger, even an empty one."""
    with pytest.raises(SparkStarted):
        job.run(settings, ledger.url, full=True)


def test_a_since_run_with_nothing_delivered_since_does_not_start_spark(ledger, settings, no_spark):
    import datetime as dt

    ledger.add("a1", "Order", example(ORDER), status="accepted")
    r = job.run(settings, ledger.url, since=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    assert (r.mode, r.status, r.nothing_new, r.spark_started, r.docs_read) == ("since", "succeeded", True, False, 0)


# --------------------------------------------------------------------------- -c/--config


def _config(tmp_path, store_url: str) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(f"store:\n  url: {store_url}\netl:\n  warehouse: {tmp_path / 'wh'}\n")
    return str(path)


@pytest.mark.parametrize("command", ["run", "status"])
@pytest.mark.parametrize("flag", ["-c", "--config"])
def test_etl_commands_take_the_config_option_like_the_others(command, flag):
    parser = gateway_cli.build_parser()
    assert parser.parse_args(["queues", flag, "gw.yaml"]).config == "gw.yaml"  # as every other command
    args = parser.parse_args(["etl", command, flag, "gw.yaml"])
    assert args.func is {"run": cli.cmd_run, "status": cli.cmd_status}[command]
    assert args.etl_config == "gw.yaml"


def test_etl_status_reads_the_store_named_by_c(ledger, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("B2BGW_STORE_URL", raising=False)
    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    cfg = _config(tmp_path, ledger.url)
    assert gateway_cli.main(["etl", "status", "-c", cfg, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["watermark"], data["runs"]) == (0, [])
    with ledger.engine.connect() as conn:  # the load's tables were created in that store
        assert "etl_runs" in sa.inspect(conn).get_table_names()


def test_etl_run_with_c_and_nothing_new(ledger, tmp_path, monkeypatch, capsys, no_spark):
    monkeypatch.delenv("B2BGW_STORE_URL", raising=False)
    cfg = _config(tmp_path, ledger.url)
    assert gateway_cli.main(["etl", "run", "-c", cfg, "--no-progress"]) == 0
    assert "nothing new" in capsys.readouterr().out
    assert [r.status for r in runs(ledger.url)] == ["succeeded"]


def test_without_c_the_config_comes_from_b2bgw_config(ledger, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("B2BGW_STORE_URL", raising=False)
    monkeypatch.setenv("B2BGW_CONFIG", _config(tmp_path, ledger.url))
    monkeypatch.chdir(tmp_path)
    assert gateway_cli.main(["etl", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["watermark"] == 0
    with ledger.engine.connect() as conn:
        assert "etl_runs" in sa.inspect(conn).get_table_names()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read the configuration"),
        ("store: [unclosed\n", "configuration error"),
        ("etl:\n  schedule: at two\n", "configuration error (etl.schedule): must be a crontab expression"),
    ],
)
def test_a_bad_config_file_is_a_message_not_a_traceback(content, says, tmp_path, capsys):
    path = tmp_path / "gw.yaml"
    if content is not None:
        path.write_text(content)
    for command in ("run", "status"):
        assert (
            gateway_cli.main(["etl", command, "-c", str(path)]) == 2
        )  # a configuration that does not load is a user error (docs/cli.md)
        err = capsys.readouterr().err
        assert err.startswith("etl: ") and says in err and "Traceback" not in err


def test_a_store_without_the_gateway_ledger_is_named_not_a_traceback(tmp_path, capsys, no_spark):
    """A store the gateway never wrote (a wrong --db-url, or before `b2bgw db
    upgrade`): the answer names it and says what to do, before any Spark."""
    url = f"sqlite:///{tmp_path / 'other.db'}"
    with pytest.raises(job.EtlError, match=r"has no gateway ledger \(b2b_ledger_events\).*b2bgw db upgrade"):
        job.run(_settings(), url)
    assert cli.main(["run", "--db-url", url, "--warehouse", str(tmp_path / "wh"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("etl: FAILED: the store sqlite:///") and "Traceback" not in err
