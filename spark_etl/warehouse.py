"""The Parquet warehouse: table layouts, the fact transforms, the correction
rule, staging and publishing.

The fact tables live under ``<warehouse>/<table>/issue_date=YYYY-MM-DD/``;
every fact row carries ``message_id`` and ``ledger_seq`` (the seq of its
document's first delivered/replied event: its load window). A run rewrites
each partition it touches as ONE file, so nightly loads never pile up small
files: the window is hash-partitioned by issue date as it is read, so a table
whose new content is only new rows is written straight from it, and one that
also keeps live rows or derived ones is repartitioned by date first.
``dim_partner`` and ``dim_date`` are rewritten whole. ``_staging/`` and
``_etl/`` (ignored by Spark and pyarrow for the leading underscore) hold work
in progress.

A run writes the touched partitions' new content under
``_staging/run-<id>/`` (nothing live is modified), reconciles it
(:mod:`spark_etl.job`), stores the journal (per partition: the live files to
remove, the staged ones to add) in ``etl_runs.manifest`` as ``publishing``,
then :func:`publish` moves the staged files in and deletes those they
replace; every step can be repeated, so the next run rolls a dead one
forward. Recording the run as succeeded advances the watermark.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

log = logging.getLogger(__name__)

__all__ = [
    "DIM_TABLES",
    "FACT_TABLES",
    "PARTITION",
    "SCHEMAS",
    "Storage",
    "derive_orders",
    "fact_rows",
    "publish",
]

PARTITION = "issue_date"
AMOUNT = "decimal(18,6)"
KEY = ["partner", "direction", "order_id"]  # an order we sent and one we received never share a key

_DDL = {
    "fact_order": f"""
        message_id string, partner string, direction string, order_id string, buyer_id string, buyer_name string,
        seller_id string, seller_name string, currency string, line_count int,
        line_extension_amount {AMOUNT}, tax_amount {AMOUNT}, allowance_total_amount {AMOUNT},
        charge_total_amount {AMOUNT}, payable_amount {AMOUNT}, received_at timestamp, delivered_at timestamp,
        ledger_seq bigint, status string, revision int, last_change_message_id string, cancel_message_id string,
        current_line_count int, current_line_extension_amount {AMOUNT}, current_payable_amount {AMOUNT},
        issue_date date""",
    "fact_order_line": f"""
        message_id string, partner string, direction string, order_id string, source_doc_type string, line_no int, line_id string,
        line_status string, item_id string, item_std_id string, item_name string, quantity {AMOUNT},
        unit_code string, price_amount {AMOUNT}, line_amount {AMOUNT}, tax_amount {AMOUNT}, currency string,
        ledger_seq bigint, is_current boolean, superseded_by string, issue_date date""",
    "fact_order_change": f"""
        message_id string, partner string, direction string, order_id string, change_id string, kind string, sequence_number bigint,
        currency string, line_count int, line_extension_amount {AMOUNT}, payable_amount {AMOUNT}, note string,
        received_at timestamp, delivered_at timestamp, ledger_seq bigint, applied boolean,
        applied_to_message_id string, issue_date date""",
    "fact_invoice": f"""
        message_id string, partner string, direction string, invoice_id string, type_code string, order_ref string,
        supplier_id string, supplier_name string, customer_id string, customer_name string, currency string,
        line_count int, line_extension_amount {AMOUNT}, tax_exclusive_amount {AMOUNT},
        tax_inclusive_amount {AMOUNT}, tax_amount {AMOUNT}, allowance_total_amount {AMOUNT},
        charge_total_amount {AMOUNT}, prepaid_amount {AMOUNT}, payable_amount {AMOUNT},
        received_at timestamp, delivered_at timestamp, ledger_seq bigint, issue_date date""",
    "fact_invoice_line": f"""
        message_id string, partner string, direction string, invoice_id string, line_no int, line_id string, order_line_ref string,
        item_id string, item_std_id string, item_name string, quantity {AMOUNT}, unit_code string,
        price_amount {AMOUNT}, line_amount {AMOUNT}, tax_amount {AMOUNT}, currency string, ledger_seq bigint,
        issue_date date""",
    "dim_partner": """
        partner string, party_id string, party_name string, first_issue_date date, last_issue_date date,
        first_delivered_at timestamp, last_delivered_at timestamp, orders bigint, invoices bigint""",
    "dim_date": """
        date_key int, date date, year int, quarter int, month int, month_name string, day int,
        day_of_week int, day_name string, iso_week int, is_weekend boolean""",
}
FACT_TABLES = ("fact_order", "fact_order_line", "fact_order_change", "fact_invoice", "fact_invoice_line")
DIM_TABLES = ("dim_partner", "dim_date")
ORDER_TABLES = ("fact_order", "fact_order_line", "fact_order_change")


def _schemas() -> dict[str, Any]:
    """The tables' schemas from :data:`_DDL`, parsed here (``StructType.fromDDL``
    asks the JVM's parser, which a fresh JVM is slow to answer)."""
    from pyspark.sql import types as T

    simple = {"string": T.StringType(), "int": T.IntegerType(), "bigint": T.LongType(), "boolean": T.BooleanType(),
              "date": T.DateType(), "timestamp": T.TimestampType()}  # fmt: skip
    out = {}
    for name, ddl in _DDL.items():
        fields = []
        for col, typ in re.findall(r"(\w+) (decimal\(\d+,\d+\)|\w+)", ddl):
            dec = re.fullmatch(r"decimal\((\d+),(\d+)\)", typ)
            fields.append(T.StructField(col, T.DecimalType(int(dec[1]), int(dec[2])) if dec else simple[typ]))
        out[name] = T.StructType(fields)
    return out


SCHEMAS: dict[str, Any] = {}


def schema(table: str):
    if not SCHEMAS:
        SCHEMAS.update(_schemas())
    return SCHEMAS[table]


def columns(table: str) -> list[str]:
    return [f.name for f in schema(table).fields]


# --------------------------------------------------------------------------- transforms


def _conform(df, table: str):
    """Select *table*'s columns in order, cast to its types (one SQL
    projection: building it column by column costs a JVM round trip each)."""
    return df.selectExpr(
        *(f"CAST(`{f.name}` AS {f.dataType.simpleString()}) AS `{f.name}`" for f in schema(table).fields)
    )


class _Tables(dict):
    """Fact DataFrames built on first access: each costs the driver an analysis
    in the JVM, and most windows feed only some of the tables."""

    def __init__(self, build: dict[str, Any], conform: bool = True) -> None:
        super().__init__()
        self._build = build
        self._conform = conform

    def __missing__(self, table: str):
        df = self._build[table]()
        df = self[table] = _conform(df, table) if self._conform else df
        return df


def fact_rows(docs) -> dict[str, Any]:
    """The new fact rows of the window's documents (before the correction
    rule: every order ``open``, every line current, every change unapplied)."""
    from pyspark.sql import functions as F

    ok = docs.where(F.col("outcome") == "ok")
    ts = F.timestamp_millis
    none = F.lit(None).cast("string")
    orders = lambda: ok.where(F.col("kind") == "order").select(
        "message_id", "partner", "direction", F.col("doc_id").alias("order_id"),
        F.col("party_a_id").alias("buyer_id"), F.col("party_a_name").alias("buyer_name"),
        F.col("party_b_id").alias("seller_id"), F.col("party_b_name").alias("seller_name"), "currency",
        F.col("ctl_lines").alias("line_count"), "line_extension_amount", "tax_amount", "allowance_total_amount",
        "charge_total_amount", "payable_amount", ts("received_ms").alias("received_at"),
        ts("delivered_ms").alias("delivered_at"), "ledger_seq", F.lit("open").alias("status"),
        F.lit(0).alias("revision"), none.alias("last_change_message_id"), none.alias("cancel_message_id"),
        F.col("ctl_lines").alias("current_line_count"),
        F.col("ctl_line_amount").alias("current_line_extension_amount"),
        F.col("payable_amount").alias("current_payable_amount"), "issue_date",
    )  # fmt: skip
    is_order = F.col("kind") == "order"
    order_lines = lambda: (
        ok.where(F.col("kind").isin("order", "change"))
        .select("message_id", "partner", "direction", F.when(is_order, F.col("doc_id")).otherwise(F.col("order_ref")).alias("order_id"),
                F.when(is_order, F.lit("Order")).otherwise(F.lit("OrderChange")).alias("source_doc_type"),
                "ledger_seq", "issue_date", F.explode("lines").alias("l"))
        .select("message_id", "partner", "direction", "order_id", "source_doc_type", "l.line_no", "l.line_id", "l.line_status",
                "l.item_id", "l.item_std_id", "l.item_name", "l.quantity", "l.unit_code", "l.price_amount",
                "l.line_amount", "l.tax_amount", "l.currency", "ledger_seq", F.lit(True).alias("is_current"),
                none.alias("superseded_by"), "issue_date")
    )  # fmt: skip
    changes = lambda: ok.where(F.col("kind").isin("change", "cancellation")).select(
        "message_id", "partner", "direction", F.col("order_ref").alias("order_id"), F.col("doc_id").alias("change_id"), "kind",
        "sequence_number", "currency", F.col("ctl_lines").alias("line_count"), "line_extension_amount",
        "payable_amount", "note", ts("received_ms").alias("received_at"), ts("delivered_ms").alias("delivered_at"),
        "ledger_seq", F.lit(False).alias("applied"), none.alias("applied_to_message_id"), "issue_date",
    )  # fmt: skip
    invoices = lambda: ok.where(F.col("kind") == "invoice").select(
        "message_id", "partner", "direction", F.col("doc_id").alias("invoice_id"), "type_code", "order_ref",
        F.col("party_a_id").alias("supplier_id"), F.col("party_a_name").alias("supplier_name"),
        F.col("party_b_id").alias("customer_id"), F.col("party_b_name").alias("customer_name"), "currency",
        F.col("ctl_lines").alias("line_count"), "line_extension_amount", "tax_exclusive_amount",
        "tax_inclusive_amount", "tax_amount", "allowance_total_amount", "charge_total_amount", "prepaid_amount",
        "payable_amount", ts("received_ms").alias("received_at"), ts("delivered_ms").alias("delivered_at"),
        "ledger_seq", "issue_date",
    )  # fmt: skip
    invoice_lines = lambda: (
        ok.where(F.col("kind") == "invoice")
        .select("message_id", "partner", "direction", F.col("doc_id").alias("invoice_id"), "ledger_seq",
                "issue_date", F.explode("lines").alias("l"))
        .select("message_id", "partner", "direction", "invoice_id", "l.line_no", "l.line_id",
                F.col("l.ref_line_id").alias("order_line_ref"), "l.item_id", "l.item_std_id", "l.item_name",
                "l.quantity", "l.unit_code", "l.price_amount", "l.line_amount", "l.tax_amount", "l.currency",
                "ledger_seq", "issue_date")
    )  # fmt: skip
    out = {
        "fact_order": orders,
        "fact_order_line": order_lines,
        "fact_order_change": changes,
        "fact_invoice": invoices,
        "fact_invoice_line": invoice_lines,
    }
    return _Tables(out)


def derive_orders(orders, changes, lines, materialize: Any = None) -> tuple[Any, Any, Any]:
    """The correction rule, applied to ALL the rows of a set of order keys
    ``(partner, direction, order_id)`` (see the package docstring for the rule itself).

    It is a pure function of those rows, so whether they arrive in one run or
    several, in order or not, the result is the same. *materialize* (e.g.
    ``DataFrame.localCheckpoint``) is applied to the intermediate results
    that several outputs share, so each is computed once.
    """
    keep = materialize or (lambda df: df)
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    by_key_latest = Window.partitionBy(*KEY).orderBy(F.col("ledger_seq").desc(), F.col("message_id").desc())
    ranked = keep(orders.withColumn("_rank", F.row_number().over(by_key_latest)))
    eff = ranked.where("_rank = 1").select(*KEY, F.col("message_id").alias("_eff"))

    chg = keep(changes.drop("applied", "applied_to_message_id").join(eff, KEY, "left"))
    changes_out = chg.withColumn("applied", F.col("_eff").isNotNull()).withColumn(
        "applied_to_message_id", F.col("_eff")
    )
    applied = chg.where(F.col("_eff").isNotNull())
    is_change, is_cancel = F.col("kind") == "change", F.col("kind") == "cancellation"
    agg = applied.groupBy(*KEY).agg(
        F.sum(F.when(is_change, 1).otherwise(0)).cast("int").alias("_revision"),
        F.min(F.when(is_cancel, F.struct("ledger_seq", "message_id"))).getField("message_id").alias("_cancel"),
        F.max(F.when(is_change, F.struct("ledger_seq", "message_id"))).getField("message_id").alias("_last_change"),
        F.max(F.when(is_change & F.col("payable_amount").isNotNull(), F.struct("ledger_seq", "payable_amount")))
        .getField("payable_amount")
        .alias("_change_payable"),
    )

    agg = keep(agg)
    ln = lines.drop("is_current", "superseded_by").join(eff, KEY, "left").join(agg.select(*KEY, "_cancel"), KEY, "left")
    from_change = F.col("source_doc_type") == "OrderChange"
    counts = (F.col("_eff").isNotNull()) & (from_change | (F.col("message_id") == F.col("_eff")))
    versions = Window.partitionBy(*KEY, "line_id").orderBy(
        F.col("_change_rank"), F.col("ledger_seq"), F.col("message_id"), F.col("line_no")
    )
    live = (
        ln.where(counts)
        .withColumn("_change_rank", F.when(from_change, 1).otherwise(0))
        .withColumn("_next", F.lead("message_id").over(versions))
    )
    last = F.col("_next").isNull()
    line_cancelled = F.coalesce(F.lower(F.col("line_status")) == "cancelled", F.lit(False))
    live = live.withColumn("is_current", last & ~line_cancelled & F.col("_cancel").isNull()).withColumn(
        "superseded_by",
        F.when(~last, F.col("_next")).when(~line_cancelled & F.col("_cancel").isNotNull(), F.col("_cancel")),
    )
    dead = (
        ln.where(~counts)
        .withColumn("is_current", F.lit(False))
        .withColumn("superseded_by", F.when(F.col("source_doc_type") == "Order", F.col("_eff")))
    )
    lines_out = keep(_conform(live, "fact_order_line").unionByName(_conform(dead, "fact_order_line")))

    current = (
        lines_out.where("is_current")
        .groupBy(*KEY)
        .agg(F.count(F.lit(1)).cast("int").alias("_cur_lines"), F.sum("line_amount").alias("_cur_amount"))
    )
    o = ranked.drop("status", "revision", "last_change_message_id", "cancel_message_id", "current_line_count",
                    "current_line_extension_amount", "current_payable_amount")  # fmt: skip
    o = o.join(agg, KEY, "left").join(current, KEY, "left")
    effective = F.col("_rank") == 1
    cancelled = effective & F.col("_cancel").isNotNull()
    zero = F.lit(0).cast(AMOUNT)
    orders_out = (
        o.withColumn(
            "status",
            F.when(~effective, "replaced").when(cancelled, "cancelled")
            .when(F.coalesce(F.col("_revision"), F.lit(0)) > 0, "changed").otherwise("open"),
        )
        .withColumn("revision", F.when(effective, F.coalesce(F.col("_revision"), F.lit(0))).otherwise(0))
        .withColumn("last_change_message_id", F.when(effective, F.col("_last_change")))
        .withColumn("cancel_message_id", F.when(effective, F.col("_cancel")))
        .withColumn("current_line_count", F.when(effective, F.coalesce(F.col("_cur_lines"), F.lit(0))).otherwise(0))
        .withColumn("current_line_extension_amount",
                    F.when(effective, F.coalesce(F.col("_cur_amount"), zero)).otherwise(zero))
        .withColumn("current_payable_amount",
                    F.when(effective & ~cancelled, F.coalesce(F.col("_change_payable"), F.col("payable_amount")))
                    .otherwise(zero))
    )  # fmt: skip
    return keep(_conform(orders_out, "fact_order")), keep(_conform(changes_out, "fact_order_change")), lines_out


def dim_partner(orders, invoices):
    """One row per ledger partner: the party it appears as in its own
    documents (the buyer of its orders, the supplier of its invoices; the
    seller and the customer of those it was sent: the latest one by
    delivery), its first/last issue dates and deliveries, and how many orders
    and invoices it has in the warehouse, both directions."""
    from pyspark.sql import functions as F

    sent = F.col("direction") == "outbound"
    party = lambda ours, theirs, name: F.when(sent, F.col(theirs)).otherwise(F.col(ours)).alias(name)
    both = orders.select(
        "partner", party("buyer_id", "seller_id", "party_id"), party("buyer_name", "seller_name", "party_name"),
        "issue_date", "delivered_at", "ledger_seq", F.lit(1).alias("o"), F.lit(0).alias("i"),
    ).unionByName(invoices.select(
        "partner", party("supplier_id", "customer_id", "party_id"),
        party("supplier_name", "customer_name", "party_name"), "issue_date", "delivered_at", "ledger_seq",
        F.lit(0).alias("o"), F.lit(1).alias("i"),
    ))  # fmt: skip
    latest = F.max(F.struct("ledger_seq", "party_id", "party_name"))
    out = both.groupBy("partner").agg(
        latest.getField("party_id").alias("party_id"), latest.getField("party_name").alias("party_name"),
        F.min("issue_date").alias("first_issue_date"), F.max("issue_date").alias("last_issue_date"),
        F.min("delivered_at").alias("first_delivered_at"), F.max("delivered_at").alias("last_delivered_at"),
        F.sum("o").cast("bigint").alias("orders"), F.sum("i").cast("bigint").alias("invoices"),
    )  # fmt: skip
    return _conform(out, "dim_partner")


def dim_date_rows(dates: Iterable[_dt.date]) -> list[tuple]:
    """Every day from the first to the last of *dates* (none when empty)."""
    dates = sorted(set(dates))
    if not dates:
        return []
    out = []
    day, last = dates[0], dates[-1]
    while day <= last:
        iso = day.isocalendar()
        out.append((
            day.year * 10000 + day.month * 100 + day.day, day, day.year, (day.month - 1) // 3 + 1, day.month,
            day.strftime("%B"), day.day, iso[2], day.strftime("%A"), iso[1], iso[2] >= 6,
        ))  # fmt: skip
        day += _dt.timedelta(days=1)
    return out


# --------------------------------------------------------------------------- storage


def qualify(path: str) -> str:
    """A warehouse location as a URI (local paths become ``file:///abs``)."""
    if urlparse(path).scheme and len(urlparse(path).scheme) > 1:
        return path.rstrip("/")
    return "file://" + os.path.abspath(path)


@dataclass
class Storage:
    """The warehouse's files, through Hadoop's FileSystem API on the Spark
    driver (the same file systems Spark itself writes: local, HDFS, S3A...)."""

    spark: Any
    root: str

    def __post_init__(self) -> None:
        self.root = qualify(self.root)
        # A warehouse on the local file system is handled with os calls (the
        # same operations as Hadoop's local file system, without a Py4J round
        # trip each: a run makes hundreds of them).
        self.local = self.root.startswith("file:")
        jvm = self.spark._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        self._fs = self._Path(self.root).getFileSystem(self.spark._jsc.hadoopConfiguration())

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *[p.strip("/") for p in parts if p]])

    @staticmethod
    def local_path(uri: str) -> str:
        """A ``file:`` URI as a local path."""
        from urllib.parse import unquote

        return unquote(urlparse(uri).path)

    def exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(self.local_path(path))
        return bool(self._fs.exists(self._Path(path)))

    def list(self, path: str) -> list[tuple[str, bool]]:
        """(name, is_dir) of the entries of *path* ([] when it does not exist)."""
        if self.local:
            try:
                with os.scandir(self.local_path(path)) as entries:
                    return [(e.name, e.is_dir()) for e in entries]
            except (FileNotFoundError, NotADirectoryError):
                return []
        p = self._Path(path)
        if not self._fs.exists(p):
            return []
        return [(st.getPath().getName(), bool(st.isDirectory())) for st in self._fs.listStatus(p)]

    def data_files(self, path: str) -> list[str]:
        return sorted(
            n for n, d in self.list(path) if not d and n.endswith(".parquet") and not n.startswith(("_", "."))
        )

    def partitions(self, table: str) -> list[str]:
        """The partition directories (``issue_date=...``) of a fact table."""
        return sorted(n for n, d in self.list(self.path(table)) if d and n.startswith(PARTITION + "="))

    def mkdirs(self, path: str) -> None:
        if self.local:
            os.makedirs(self.local_path(path), exist_ok=True)
            return
        self._fs.mkdirs(self._Path(path))

    def rename(self, src: str, dst: str) -> bool:
        """Move a file or a directory; False when *src* is missing or *dst* exists."""
        if self.local:
            s, d = self.local_path(src), self.local_path(dst)
            if not os.path.exists(s) or os.path.exists(d):
                return False
            os.makedirs(os.path.dirname(d), exist_ok=True)
            os.rename(s, d)
            return True
        return bool(self._fs.rename(self._Path(src), self._Path(dst)))

    def delete(self, path: str, recursive: bool = False) -> bool:
        if self.local:
            p = self.local_path(path)
            if os.path.isdir(p) and not os.path.islink(p):
                if recursive:
                    shutil.rmtree(p)
                else:
                    os.rmdir(p)
                return True
            if os.path.lexists(p):
                os.remove(p)
                return True
            return False
        p = self._Path(path)
        return bool(self._fs.exists(p) and self._fs.delete(p, recursive))

    def has_data(self, table: str) -> bool:
        if table in DIM_TABLES:
            return bool(self.data_files(self.path(table)))
        return bool(self.partitions(table))

    def read(self, table: str, path: str | None = None):
        """The table (or a staged copy at *path*) as a DataFrame with its
        schema; empty when there is no file."""
        spark = self.spark
        path = path or self.path(table)
        has_files = (
            bool(self.data_files(path)) if table in DIM_TABLES
            else any(n.startswith(PARTITION + "=") and d for n, d in self.list(path))
        )  # fmt: skip
        if not has_files:
            return spark.createDataFrame([], schema(table))
        df = spark.read.schema(schema(table)).option("basePath", path).parquet(path)
        if table in FACT_TABLES:  # files written before the direction column hold inbound documents only
            from pyspark.sql import functions as F

            df = df.withColumn("direction", F.coalesce(F.col("direction"), F.lit("inbound")))
        return df


def partition_name(day: _dt.date | str) -> str:
    return f"{PARTITION}={day if isinstance(day, str) else day.isoformat()}"


def publish(storage: Storage, manifest: dict[str, Any]) -> None:
    """Apply a publish journal; every step is idempotent, so a journal whose
    publication was interrupted is simply applied again."""
    staging = manifest["staging"]
    for table, parts in manifest["tables"].items():
        for part, change in parts.items():
            live_dir = storage.path(table, part)
            staged_dir = "/".join(x for x in (staging, table, part) if x)
            storage.mkdirs(live_dir)
            for name in change["new"]:
                src, dst = f"{staged_dir}/{name}", f"{live_dir}/{name}"
                if storage.exists(src):
                    if storage.exists(dst):
                        storage.delete(dst)
                    if not storage.rename(src, dst):
                        raise OSError(f"could not move {src} to {dst}")
                elif not storage.exists(dst):
                    raise OSError(f"staged file {src} is missing and was never published")
            for name in change["old"]:
                if name not in change["new"]:
                    storage.delete(f"{live_dir}/{name}")
            if part and not change["new"] and not storage.data_files(live_dir):
                storage.delete(live_dir, recursive=True)  # the partition is now empty
    remove_staging(storage, staging)


def remove_staging(storage: Storage, staging: str) -> None:
    """Delete a run's staging directory, and ``_staging/`` once it is empty."""
    storage.delete(staging, recursive=True)
    parent = staging.rsplit("/", 1)[0]
    if parent.endswith("/_staging") and not storage.list(parent):
        storage.delete(parent, recursive=True)
