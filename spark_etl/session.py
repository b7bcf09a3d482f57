"""The SparkSession of the load: local mode by default, any master by
configuration, or the session ``spark-submit`` already created."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["get_spark"]

#: Modest defaults for a 2-core gateway host; ``etl.spark_conf`` overrides them.
LOCAL_DEFAULTS = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.compression.codec": "snappy",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "true",
    "spark.python.worker.reuse": "true",
    # partitioned writes keep one writer per partition open instead of sorting
    # every task's rows by partition first (falls back to sorting past 64);
    # planned writes would put that sort in the plan anyway, so they are off:
    # the writes are faster without the sort
    "spark.sql.maxConcurrentOutputFileWriters": "64",
    "spark.sql.optimizer.plannedWrite.enabled": "false",
    # The throughput collector for a batch job on a small heap. (Not C1 only,
    # -XX:TieredStopAtLevel=1: it does not make first loads faster, and slows
    # warm ones: Parquet encoding needs C2's code.)
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}


def get_spark(settings: dict[str, Any] | None = None):
    """The active SparkSession, or a new one for ``settings['spark_master']``.

    A session created by ``spark-submit`` (or by a test) is used as it is.
    Locally, the Python workers run this interpreter (``spark.pyspark.python``)
    unless ``PYSPARK_PYTHON`` says otherwise.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _register(active)
        return active
    settings = settings or {}
    master = settings.get("spark_master") or "local[2]"
    builder = SparkSession.builder.appName("b2bgw-etl").master(master)
    conf = dict(LOCAL_DEFAULTS)
    conf.update({str(k): str(v) for k, v in (settings.get("spark_conf") or {}).items()})
    if master.startswith("local") and not os.environ.get("PYSPARK_PYTHON"):
        # PySpark takes the workers' interpreter from this variable (the Python
        # Data Source planner too); locally that is this very interpreter.
        os.environ["PYSPARK_PYTHON"] = sys.executable
    for key, value in conf.items():
        builder = builder.config(key, value)
    _unpin_for_jvm()
    from .jvm_output import started_with_output

    with started_with_output():  # `etl run` without --verbose: Spark's own output into a file
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    _register(spark)
    return spark


def _unpin_for_jvm() -> None:
    """A gateway serving process bound to one CPU (``b2bgw serve`` with
    ``server.processes`` > 1 and ``pin_processes``) names every CPU it was
    given in ``B2BGW_CPUS``: this thread takes them all back before it starts
    the JVM, so the JVM (which inherits the starting thread's CPU set) uses
    them all."""
    cpus = os.environ.get("B2BGW_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
        except (ValueError, OSError):  # a CPU went away: start with what we have
            pass


def _register(spark) -> None:
    from .source import register

    register(spark)
