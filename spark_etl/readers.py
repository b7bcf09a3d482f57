"""How a load reads its window of the ledger: through the Python Data Source
on the executors (:func:`read_spark`, any master), or from the Parquet files
the driver staged with Arrow (:func:`staged_tables`, local mode)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_etl import warehouse
from spark_etl.progress import Steps
from spark_etl.warehouse import KEY, PARTITION, Storage

__all__ = ["WindowRead", "read_spark", "staged_tables"]


@dataclass
class WindowRead:
    """The parsed window as Spark sees it."""

    new: Any  # the window's new fact rows per table (warehouse.fact_rows)
    summary: list[Any]  # the parse summary rows, for spark_etl.reconcile.control_totals
    repeated_keys: list[tuple[str, str, str]]  # order keys sent more than once in the window
    quarantined: Callable[[], list[dict[str, Any]]]  # collects the quarantined documents (a Spark job)


def read_spark(
    spark: Any,
    db_url: str,
    ranges: Any,
    *,
    reparse: bool,
    batch_size: int,
    partitions: int,
    keep: Callable[[Any], Any],
    steps: Steps,
    total: int,
) -> WindowRead:
    """The window read by the ``b2b_ledger`` data source in *ranges*: the documents hash-partitioned by issue
    date into *partitions* and kept by *keep* (a local checkpoint or the cache), then one query for what the
    driver must know. *steps* is the run's progress: ``steps.docs`` counts documents while they are read, and
    ``steps("read")``, ``steps("summary")`` mark the two steps."""
    from pyspark.sql import functions as F

    docs = (
        spark.read.format("b2b_ledger").option("url", db_url).option("ranges", json.dumps(ranges))
        .option("mode", "parsed").option("reparse", str(reparse).lower())
        .option("batch_size", str(batch_size)).load()
    )  # fmt: skip
    done = threading.Event()
    steps.docs(spark, total, done)
    try:
        docs = keep(docs.repartition(partitions, PARTITION))
        steps("read")
        # One job for what the driver needs to know about the window: the
        # control totals per type, outcome and date, and the order keys
        # sent more than once in it (usually none; the correction rule's).
        none = F.lit(None).cast("string")
        summary = (
            docs.groupBy("doc_type", "outcome", "kind", PARTITION)
            .agg(F.count(F.lit(1)).alias("n"), F.sum("ctl_lines").alias("lines"),
                 F.sum("ctl_line_amount").alias("line_amount"), F.sum("ctl_payable_amount").alias("payable"))
            .withColumns({"partner": none, "direction": none, "order_id": none})
        )  # fmt: skip
        repeated = (
            docs.where((F.col("outcome") == "ok") & (F.col("kind") == "order"))
            .groupBy("partner", "direction", F.col("doc_id").alias("order_id")).count().where("count > 1")
            .select(*(F.lit(None).cast(f.dataType).alias(f.name) for f in summary.schema.fields[:-3]), *KEY)
        )  # fmt: skip
        rows = summary.unionByName(repeated).collect()
    finally:
        done.set()
    steps("summary")

    def quarantined() -> list[dict[str, Any]]:
        return [
            r.asDict()
            for r in docs.where(F.col("outcome") == "quarantined")
            .select("message_id", "partner", "doc_type", "ledger_seq", "reason")
            .collect()
        ]  # fmt: skip

    return WindowRead(
        new=warehouse.fact_rows(docs),
        summary=[r for r in rows if r["n"] is not None],
        repeated_keys=[(r["partner"], r["direction"], r["order_id"]) for r in rows if r["n"] is None],
        quarantined=quarantined,
    )


def staged_tables(storage: Storage, path: str) -> Any:
    """The new fact rows staged with Arrow under *path* (one directory per table), read by Spark's Parquet
    reader where they are combined with other rows."""
    return warehouse._Tables({t: (lambda t=t: storage.read(t, f"{path}/{t}")) for t in warehouse.FACT_TABLES},
                             conform=False)  # fmt: skip
