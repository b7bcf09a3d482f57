"""The load on a real Spark standalone cluster (docs/spark-cluster.md).

A master and a worker are started from the installed pyspark package
(``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``)
on 127.0.0.1 with free ports; ``b2bgw etl run --master spark://...`` runs in
another process and directory, with the sample configuration's relative store
URL ``sqlite:///var/b2bgw.db``. The executors run in the worker's own work
directory, so they only find the ledger if the driver resolved its path. The
daemons are stopped (with their executors) whatever the outcome.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from etltest import EXAMPLES, INVOICE, ORDER, ORDER_CHANGE, Ledger, example, table

from spark_etl import state

pytestmark = pytest.mark.skipif(not EXAMPLES.is_dir(), reason=f"the OASIS UBL examples are not at {EXAMPLES}")

#: seconds the daemons may take to come up, and the load to finish, on a busy host
START_TIMEOUT = 120
RUN_TIMEOUT = 300


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("B2BGW_STORE_URL", None)
    env.pop("B2BGW_CONFIG", None)
    env.update({
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",  # every daemon, driver and executor on the loopback
        "SPARK_DAEMON_MEMORY": "256m",  # the master's and the worker's heaps (1g each by default)
        "PYSPARK_PYTHON": sys.executable,  # the executors' Python: the one with b2bgw installed
    })  # fmt: skip
    return env


class Daemons:
    """Processes started in their own process groups, stopped together (a
    worker's executors are in its group)."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen, Path]] = []

    def start(self, name: str, args: list[str], cwd: Path, log: Path, **kw) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, **kw)  # fmt: skip
        self.procs.append((name, proc, log))
        return proc

    def stop(self) -> None:
        for _, proc, _ in reversed(self.procs):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for _, proc, _ in reversed(self.procs):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc, signal.SIGKILL)  # the group's leftovers (executors), and the leader if still up
            proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ({log}):\n{_tail(log)}" for name, proc, log in self.procs)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group this test created for the process (start_new_session)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError as exc:
        return f"({exc})"


def wait_for(log: Path, text: str, proc: subprocess.Popen, daemons: Daemons, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in _tail(log, 1 << 20):
            return
        if proc.poll() is not None:
            pytest.fail(f"{log.name}: the process ended ({proc.returncode}) before {text!r}\n{daemons.logs()}")
        time.sleep(0.25)
    pytest.fail(f"{log.name}: no {text!r} within {timeout}s\n{daemons.logs()}")


@pytest.fixture
def cluster(tmp_path):
    """``(master URL, worker work dir, daemons)`` of a one-worker standalone cluster."""
    spark_class = spark_home() / "bin" / "spark-class"
    if not spark_class.is_file():
        pytest.fail(f"pyspark has no {spark_class}")
    env = spark_env()
    daemons = Daemons()
    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    work = tmp_path / "worker" / "work"
    try:
        m = daemons.start("master", [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                     "--port", str(port), "--webui-port", str(free_port())],
                          tmp_path / "master", tmp_path / "master.log", env=env)  # fmt: skip
        wait_for(tmp_path / "master.log", "I have been elected leader", m, daemons)
        w = daemons.start("worker", [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                     "--webui-port", str(free_port()), "--cores", "2", "--memory", "1g",
                                     "--work-dir", str(work), master],
                          tmp_path / "worker", tmp_path / "worker.log", env=env)  # fmt: skip
        wait_for(tmp_path / "worker.log", "Successfully registered with master", w, daemons)
        yield master, work, daemons
    finally:
        daemons.stop()


def test_the_load_on_a_standalone_cluster_with_a_relative_store_url(cluster, tmp_path):
    master, work, daemons = cluster
    driver = tmp_path / "driver"
    (driver / "var").mkdir(parents=True)
    (driver / "gw.yaml").write_text(
        "store:\n  url: sqlite:///var/b2bgw.db\n"
        "etl:\n  warehouse: ./var/warehouse\n  spark_conf:\n"
        "    spark.driver.memory: 512m\n    spark.executor.memory: 512m\n    spark.cores.max: 2\n"
    )
    ledger = Ledger(f"sqlite:///{driver / 'var' / 'b2bgw.db'}")
    try:
        ledger.add("o1", "Order", example(ORDER))
        ledger.add("i1", "Invoice", example(INVOICE))
        ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
        ledger.add("bad", "Invoice", b"<Invoice>")
    finally:
        ledger.engine.dispose()

    log = tmp_path / "driver.log"
    run = daemons.start("driver", [sys.executable, "-m", "gateway.cli.main", "etl", "run", "-c", "gw.yaml",
                                   "--master", master, "--no-progress"],
                        driver, log, env=spark_env())  # fmt: skip
    try:
        run.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"etl run did not finish within {RUN_TIMEOUT}s\n{daemons.logs()}")
    out = _tail(log, 1 << 20)
    assert run.returncode == 0, daemons.logs()
    assert "4 documents read, 3 loaded, 1 quarantined" in out, daemons.logs()

    # the documents were read by executors of the worker, in its work directory
    assert list(work.glob("app-*/*/stderr")), f"no executor ran under {work}\n{daemons.logs()}"
    engine = sa.create_engine(f"sqlite:///{driver / 'var' / 'b2bgw.db'}")
    try:
        with engine.connect() as conn:
            (rec,) = state.list_runs(conn)
            quarantined = state.list_quarantine(conn)
    finally:
        engine.dispose()
    assert (rec.status, rec.docs_read, rec.loaded, rec.quarantined) == ("succeeded", 4, 3, 1)
    assert rec.stats["staging"] == "spark"  # the Data Source path, not the driver's Arrow staging
    assert [q["message_id"] for q in quarantined] == ["bad"]

    warehouse = driver / "var" / "warehouse"
    (order,) = table(warehouse, "fact_order")
    assert (order["message_id"], order["order_id"], order["status"], order["revision"]) == ("o1", "34", "changed", 1)
    assert [c["message_id"] for c in table(warehouse, "fact_order_change")] == ["c1"]
    assert [i["message_id"] for i in table(warehouse, "fact_invoice")] == ["i1"]
    assert len(table(warehouse, "fact_invoice_line")) == 5
    assert {p["partner"] for p in table(warehouse, "dim_partner")} == {"ACME"}
