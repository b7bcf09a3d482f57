"""Fixtures of the warehouse-load tests.

One session-scoped local SparkSession (``local[2]``, 2 shuffle partitions, UI
off) is shared by every test: Spark starts once. Ledgers are tmp SQLite files
with the gateway's ledger tables (``metadata.create_all``) and fixture rows
inserted here; the documents are the official OASIS UBL 2.1 examples, edited
where a test needs another id or line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from etltest import EXAMPLES, Ledger


@pytest.fixture(scope="session")
def spark():
    if not EXAMPLES.is_dir():
        pytest.skip(f"the OASIS UBL examples are not at {EXAMPLES}")
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("spark_etl-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    from spark_etl.source import register

    register(session)
    yield session
    session.stop()


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    yield led
    led.engine.dispose()


@pytest.fixture
def settings(tmp_path) -> dict:
    from spark_etl.config import resolve

    return resolve({"warehouse": str(tmp_path / "warehouse"), "read_partitions": 2, "lock_ttl": 60})
