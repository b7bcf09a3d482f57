"""Benchmark of the warehouse load (spark_etl) against a single-process baseline.

Generates N UBL Orders (default 100,000) from the structure of the OASIS
example ``UBL-Order-2.1-Example.xml`` (its header, parties, totals and its
order line, with varied partners, buyers, sellers, ids, dates, currencies,
items and 1-20 lines each), records them in a SQLite ledger as delivered
(``b2b_ledger`` + ``accepted``/``delivered`` events) with their warehouse
facts extracted the way the gateway does at intake (the gateway's own parse,
then ``ledger_contract.facts.for_ledger`` on that tree; its CPU time per order is
printed: that is what the edge pays), then prints:

* the ETL (``spark_etl.job.run``, local[2]): orders/s and lines/s of a first
  load of the N orders into an empty warehouse, from the stored facts (the
  SparkSession is started before the clock starts; its start-up time is
  printed separately);
* the time of a rerun with nothing new (the incremental run right after);
* the time of a full rebuild from the raw XML alone (``--full --reparse``);
* the baseline: one Python process, lxml + pyarrow, parsing the same
  ledger's XML and writing the same fact tables (fact_order,
  fact_order_line, partitioned by issue_date) with no Spark at all.

Usage::

    .venv/bin/python bench/etl_bench.py                 # 100,000 orders
    .venv/bin/python bench/etl_bench.py --orders 20000 --workdir /tmp/etl/bench
    .venv/bin/python bench/etl_bench.py --pretty        # indented XML as in the example

The generated ledger is cached in the work directory (keyed by the
parameters) and reused by the next run with the same parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sqlite3
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT.parent / "shared" / "ubl-2.1" / "xml"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ORDER_NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
CURRENCIES = ["SEK", "EUR", "NOK", "DKK", "USD", "GBP"]
UNITS = ["LTR", "C62", "KGM", "MTR", "BX", "EA"]


# --------------------------------------------------------------------------- generation


def _templates(pretty: bool) -> tuple[str, str, str]:
    """(header, line, footer) format strings cut from the OASIS Order example."""
    text = (EXAMPLES / "UBL-Order-2.1-Example.xml").read_text(encoding="utf-8")
    if not pretty:
        text = re.sub(r">\s+<", "><", text)
        text = re.sub(r"\s+>", ">", text)
    first = text.index("<cac:OrderLine>")
    second = text.index("<cac:OrderLine>", first + 1)
    end = text.rindex("</Order>")
    head, line, foot = text[:first], text[first:second], text[end:]
    head = head.replace("{", "{{").replace("}", "}}")
    line = line.replace("{", "{{").replace("}", "}}")

    def sub(s: str, old: str, new: str, count: int = 1) -> str:
        if old not in s:
            raise RuntimeError(f"the OASIS example changed: {old!r} not found")
        return s.replace(old, new, count)

    head = sub(head, "<cbc:ID>34</cbc:ID>", "<cbc:ID>{order_id}</cbc:ID>")
    head = sub(head, "<cbc:IssueDate>2010-01-20</cbc:IssueDate>", "<cbc:IssueDate>{issue_date}</cbc:IssueDate>")
    head = sub(head, "<cbc:DocumentCurrencyCode>SEK", "<cbc:DocumentCurrencyCode>{currency}")
    head = sub(head, ">7300070011115<", ">{buyer_id}<")
    head = sub(head, "<cbc:Name>Johnssons byggvaror</cbc:Name>", "<cbc:Name>{buyer_name}</cbc:Name>")
    head = sub(head, ">SellerPartyID123<", ">{seller_id}<")
    head = sub(head, "<cbc:Name>Moderna Produkter AB</cbc:Name>", "<cbc:Name>{seller_name}</cbc:Name>")
    head = sub(
        head,
        '<cbc:TaxAmount currencyID="SEK">100</cbc:TaxAmount>',
        '<cbc:TaxAmount currencyID="SEK">{tax}</cbc:TaxAmount>',
    )
    head = sub(
        head,
        '<cbc:LineExtensionAmount currencyID="SEK">6225</cbc:LineExtensionAmount>',
        '<cbc:LineExtensionAmount currencyID="SEK">{total}</cbc:LineExtensionAmount>',
    )
    head = sub(
        head,
        '<cbc:PayableAmount currencyID="SEK">6225</cbc:PayableAmount>',
        '<cbc:PayableAmount currencyID="SEK">{payable}</cbc:PayableAmount>',
    )
    head = head.replace('currencyID="SEK"', 'currencyID="{currency}"')
    line = sub(line, "<cbc:ID>1</cbc:ID>", "<cbc:ID>{line_id}</cbc:ID>")
    line = sub(
        line, '<cbc:Quantity unitCode="LTR">120</cbc:Quantity>', '<cbc:Quantity unitCode="{unit}">{qty}</cbc:Quantity>'
    )
    line = sub(
        line, '<cbc:LineExtensionAmount currencyID="SEK">6000<', '<cbc:LineExtensionAmount currencyID="SEK">{amount}<'
    )
    line = sub(line, '<cbc:PriceAmount currencyID="SEK">50<', '<cbc:PriceAmount currencyID="SEK">{price}<')
    line = sub(line, '<cbc:BaseQuantity unitCode="LTR">', '<cbc:BaseQuantity unitCode="{unit}">')
    line = sub(line, "<cbc:Name>Falu Rödfärg</cbc:Name>", "<cbc:Name>{item_name}</cbc:Name>")
    line = sub(line, "<cbc:ID>SItemNo001</cbc:ID>", "<cbc:ID>{item_id}</cbc:ID>")
    line = sub(line, ">1234567890123<", ">{gtin}<")
    line = line.replace('currencyID="SEK"', 'currencyID="{currency}"')
    return head, line, foot


def generate(n_orders: int, seed: int = 42, pretty: bool = False):
    """Yield ``(message_id, partner, order_id, xml_bytes, n_lines)`` for *n_orders* orders."""
    head, line, foot = _templates(pretty)
    rnd = random.Random(seed)
    partners = [f"P{p:03d}" for p in range(1, 61)]
    buyers = {p: (f"73{rnd.randrange(10**10, 10**11)}", f"Buyer {p} AB") for p in partners}
    sellers = [(f"SELLER-{s:03d}", f"Seller {s} Ltd") for s in range(1, 26)]
    currency_of = {p: CURRENCIES[i % len(CURRENCIES)] for i, p in enumerate(partners)}
    items = [
        (f"SItem{i:05d}", f"Item {i} {rnd.choice(['paint', 'brush', 'pencil', 'cable', 'screw', 'board'])}",
         f"{rnd.randrange(10**12, 10**13)}", rnd.choice(UNITS), Decimal(rnd.randrange(100, 100000)) / 100)
        for i in range(1, 2001)
    ]  # fmt: skip
    counters = {p: 0 for p in partners}
    for k in range(n_orders):
        partner = partners[rnd.randrange(len(partners))]
        counters[partner] += 1
        order_id = f"PO-{partner}-{counters[partner]:07d}"
        currency = currency_of[partner]
        issue_date = f"2026-10-{1 + rnd.randrange(28):02d}"
        n_lines = rnd.randint(1, 20)
        parts = []
        total = Decimal(0)
        for ln in range(1, n_lines + 1):
            item_id, item_name, gtin, unit, price = items[rnd.randrange(len(items))]
            qty = rnd.randint(1, 100)
            amount = price * qty
            total += amount
            parts.append(
                line.format(
                    line_id=ln,
                    unit=unit,
                    qty=qty,
                    amount=amount,
                    price=price,
                    item_name=item_name,
                    item_id=item_id,
                    gtin=gtin,
                    currency=currency,
                )
            )
        tax = (total * Decimal("0.25")).quantize(Decimal("0.01"))
        buyer_id, buyer_name = buyers[partner]
        seller_id, seller_name = sellers[rnd.randrange(len(sellers))]
        xml = (
            head.format(
                order_id=order_id,
                issue_date=issue_date,
                currency=currency,
                buyer_id=buyer_id,
                buyer_name=buyer_name,
                seller_id=seller_id,
                seller_name=seller_name,
                tax=tax,
                total=total,
                payable=total + tax,
            )
            + "".join(parts)
            + foot
        )
        yield f"ID:bench-{k:08d}", partner, order_id, xml.encode("utf-8"), n_lines


def build_ledger(db_path: Path, n_orders: int, seed: int = 42, pretty: bool = False) -> dict:
    """Create the ledger tables in a SQLite file and record *n_orders* delivered
    orders, each with the facts the gateway extracts at intake."""
    import sqlalchemy as sa

    from gateway.intake.xmlsafe import IntakeLimits, parse_document
    from ledger_contract import facts as ledger_facts
    from ledger_contract.tables import metadata, pack_xml

    if db_path.exists():
        db_path.unlink()
    engine = sa.create_engine(f"sqlite:///{db_path}")
    metadata.create_all(engine)
    engine.dispose()
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    t0 = 1_790_000_000_000
    docs, events = [], []
    n_lines = n_bytes = n_facts_bytes = 0
    edge_cpu = 0.0
    limits = IntakeLimits()
    for k, (message_id, partner, order_id, xml, lines) in enumerate(generate(n_orders, seed, pretty)):
        at = t0 + k * 10
        root = parse_document(xml, limits)  # the gateway's parse (already paid at intake: not counted)
        c0 = time.process_time()
        facts = ledger_facts.for_ledger(root, "Order")  # what the edge adds
        edge_cpu += time.process_time() - c0
        if facts is None:
            raise RuntimeError(f"no facts for generated order {message_id}")
        n_facts_bytes += len(facts.encode("utf-8"))
        docs.append(
            (
                message_id,
                partner,
                "Order",
                ORDER_NS,
                order_id,
                f"{partner}:{order_id}",
                message_id,
                "orders",
                "queue://orders",
                "delivered",
                at,
                at + 5,
                pack_xml(xml),
                facts,
                ledger_facts.VERSION,
            )
        )  # the document stored as the gateway stores it
        events.append((message_id, "accepted", at))
        events.append((message_id, "delivered", at + 5))
        n_lines += lines
        n_bytes += len(xml)
        if len(docs) >= 5000:
            _flush(conn, docs, events)
    _flush(conn, docs, events)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return {
        "orders": n_orders,
        "lines": n_lines,
        "bytes": n_bytes,
        "facts_bytes": n_facts_bytes,
        "edge_us_per_order": round(edge_cpu / n_orders * 1e6, 1),
    }


def _flush(conn: sqlite3.Connection, docs: list, events: list) -> None:
    with conn:
        conn.executemany(
            "INSERT INTO b2b_ledger (message_id, partner, doc_type, doc_namespace, doc_id, idempotency_key,"
            " correlation_id, route, destination, status, received_at, updated_at, document, facts, facts_version)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            docs,
        )
        conn.executemany("INSERT INTO b2b_ledger_events (message_id, status, at) VALUES (?,?,?)", events)
    docs.clear()
    events.clear()


def cached_ledger(workdir: Path, n_orders: int, seed: int, pretty: bool) -> tuple[Path, dict]:
    """The ledger for these parameters, generated once and reused."""
    from ledger_contract import facts as ledger_facts

    workdir.mkdir(parents=True, exist_ok=True)
    name = f"ledger-{n_orders}-{seed}-{'pretty' if pretty else 'compact'}-facts{ledger_facts.VERSION}-lz4"
    db, meta = workdir / f"{name}.db", workdir / f"{name}.json"
    if db.exists() and meta.exists():
        return db, json.loads(meta.read_text())
    t = time.perf_counter()
    info = build_ledger(db, n_orders, seed, pretty)
    info["generate_s"] = round(time.perf_counter() - t, 1)
    meta.write_text(json.dumps(info))
    return db, info


# --------------------------------------------------------------------------- baseline


def baseline(db: Path, out: Path) -> dict:
    """One process, no Spark: sqlite3 + lxml (the same extractor, on the XML) + pyarrow
    writing fact_order and fact_order_line partitioned by issue_date (one file
    per partition)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    from ledger_contract.tables import unpack_xml
    from spark_etl import ubl

    if out.exists():
        shutil.rmtree(out)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    cur = conn.execute(
        "SELECT l.message_id, l.partner, l.doc_type, e.seq, l.received_at, e.at, l.document"
        " FROM b2b_ledger_events e JOIN b2b_ledger l ON l.message_id = e.message_id"
        " WHERE e.status IN ('delivered', 'replied') ORDER BY e.seq"
    )

    def rows():
        while True:
            chunk = cur.fetchmany(1000)
            if not chunk:
                return
            for row in chunk:
                yield (*row[:6], unpack_xml(row[6]))

    batches = list(ubl.extract_many(rows(), batch_size=2000))
    conn.close()
    docs = pa.Table.from_batches(batches)
    docs = docs.filter(pc.equal(docs["outcome"], "ok"))
    ms = lambda c: pc.cast(docs[c], pa.timestamp("ms"))
    orders = pa.table({
        "message_id": docs["message_id"], "partner": docs["partner"], "order_id": docs["doc_id"],
        "buyer_id": docs["party_a_id"], "buyer_name": docs["party_a_name"], "seller_id": docs["party_b_id"],
        "seller_name": docs["party_b_name"], "currency": docs["currency"], "line_count": docs["ctl_lines"],
        "line_extension_amount": docs["line_extension_amount"], "tax_amount": docs["tax_amount"],
        "allowance_total_amount": docs["allowance_total_amount"], "charge_total_amount": docs["charge_total_amount"],
        "payable_amount": docs["payable_amount"], "received_at": ms("received_ms"), "delivered_at": ms("delivered_ms"),
        "ledger_seq": docs["ledger_seq"], "issue_date": docs["issue_date"],
    })  # fmt: skip
    lines_col = docs["lines"].combine_chunks()
    parent = pc.list_parent_indices(lines_col)
    flat = pc.list_flatten(lines_col)
    take = lambda c: pc.take(docs[c], parent)
    cols = {"message_id": take("message_id"), "partner": take("partner"), "order_id": take("doc_id")}
    for f in ("line_no", "line_id", "item_id", "item_std_id", "item_name", "quantity", "unit_code", "price_amount",
              "line_amount", "tax_amount", "currency"):  # fmt: skip
        cols[f] = flat.field(f)
    cols["ledger_seq"] = take("ledger_seq")
    cols["issue_date"] = take("issue_date")
    lines = pa.table(cols)
    part = pads.partitioning(pa.schema([("issue_date", pa.date32())]), flavor="hive")
    for name, tbl in (("fact_order", orders), ("fact_order_line", lines)):
        pads.write_dataset(tbl, out / name, format="parquet", partitioning=part,
                           existing_data_behavior="overwrite_or_ignore", max_rows_per_group=1 << 20,
                           max_rows_per_file=0)  # fmt: skip
    return {"orders": orders.num_rows, "lines": lines.num_rows}


# --------------------------------------------------------------------------- parser comparison


def compare_parsers(spark, url: str, n_docs: int) -> dict[str, float]:
    """The three ways of parsing inside Spark, on the first *n_docs* documents,
    to a no-op sink: Spark's from_xml (JVM), lxml in mapInArrow, lxml inside
    the Data Source reader (the job's way). Best of two runs, seconds."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from spark_etl import source, ubl

    with sqlite3.connect(url.replace("sqlite:///", "")) as c:
        hi = c.execute(
            "SELECT max(seq) FROM (SELECT seq FROM b2b_ledger_events WHERE status='delivered' ORDER BY seq LIMIT ?)",
            (n_docs,),
        ).fetchone()[0]
    ranges = json.dumps(source.plan_ranges(0, hi, 8))

    def load(mode: str):
        return spark.read.format("b2b_ledger").option("url", url).option("ranges", ranges).option("mode", mode).load()

    S, dec = T.StringType(), T.DecimalType(18, 6)

    def st(*fields):
        return T.StructType([T.StructField(n, t) for n, t in fields])

    party = st(("Party", st(("PartyIdentification", T.ArrayType(st(("ID", S)))), ("EndpointID", S),
                            ("PartyName", T.ArrayType(st(("Name", S)))))))  # fmt: skip
    valattr = lambda a: st(("_VALUE", S), (a, S))
    line = st(("LineItem", st(("ID", S), ("LineStatusCode", S), ("Quantity", valattr("_unitCode")),
                              ("LineExtensionAmount", valattr("_currencyID")), ("TotalTaxAmount", S),
                              ("Price", st(("PriceAmount", S))),
                              ("Item", st(("Name", S), ("Description", T.ArrayType(S)),
                                          ("SellersItemIdentification", st(("ID", S))),
                                          ("StandardItemIdentification", st(("ID", S))))))))  # fmt: skip
    order = st(("ID", S), ("IssueDate", S), ("DocumentCurrencyCode", S), ("BuyerCustomerParty", party),
               ("SellerSupplierParty", party), ("TaxTotal", T.ArrayType(st(("TaxAmount", S)))),
               ("AnticipatedMonetaryTotal", st(("LineExtensionAmount", S), ("PayableAmount", S))),
               ("OrderLine", T.ArrayType(line)))  # fmt: skip

    def from_xml():
        x = load("raw").select("message_id", F.from_xml("document", order, {"ignoreNamespace": "true"}).alias("o"))
        x = x.select("message_id", F.col("o.ID").alias("doc_id"), F.to_date("o.IssueDate").alias("issue_date"),
                     F.col("o.AnticipatedMonetaryTotal.PayableAmount").cast(dec).alias("payable"),
                     F.col("o.BuyerCustomerParty.Party.PartyIdentification")[0]["ID"].alias("buyer"),
                     F.explode("o.OrderLine").alias("l"))  # fmt: skip
        return x.select("message_id", "doc_id", "issue_date", "payable", "buyer",
                        F.col("l.LineItem.ID").alias("line_id"),
                        F.col("l.LineItem.Quantity._VALUE").cast(dec).alias("qty"),
                        F.col("l.LineItem.Quantity._unitCode").alias("unit"),
                        F.col("l.LineItem.LineExtensionAmount._VALUE").cast(dec).alias("amount"),
                        F.col("l.LineItem.Price.PriceAmount").cast(dec).alias("price"),
                        F.col("l.LineItem.Item.Name").alias("name"),
                        F.col("l.LineItem.Item.SellersItemIdentification.ID").alias("item"))  # fmt: skip

    def parse_batches(it):
        for b in it:
            rows = zip(*(b.column(i).to_pylist() for i in range(7)), strict=False)
            yield from ubl.extract_many((m, p, d, s, r, dl, doc.encode()) for m, p, d, s, r, dl, doc in rows)

    def explode(df):
        return df.select("message_id", "issue_date", F.explode("lines").alias("l")).select(
            "message_id", "issue_date", "l.*"
        )

    variants = {
        "from_xml (Spark, JVM)": from_xml,
        "lxml in mapInArrow": lambda: explode(
            load("raw").mapInArrow(parse_batches, source.spark_schema(ubl.DOC_SCHEMA))
        ),
        "lxml in the Data Source reader": lambda: explode(load("parsed")),
    }
    out = {}
    for name, make in variants.items():
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            make().write.format("noop").mode("overwrite").save()
            best = min(best, time.perf_counter() - t)
        out[name] = best
    return out


# --------------------------------------------------------------------------- the edge


def edge_cost(repeat: int = 2000, rounds: int = 7) -> dict[str, float]:
    """CPU us of ``ledger_contract.facts.for_ledger`` on the OASIS Order example as the
    gateway parsed it (best and median of *rounds* rounds), and of the
    gateway's parse + validation for scale."""
    import statistics

    from gateway.intake.xmlsafe import IntakeLimits, parse_document
    from ledger_contract import facts as ledger_facts

    xml = (EXAMPLES / "UBL-Order-2.1-Example.xml").read_bytes()
    root = parse_document(xml, IntakeLimits())
    assert ledger_facts.for_ledger(root, "Order") is not None
    out = []
    for _ in range(rounds):
        c0 = time.process_time()
        for _ in range(repeat):
            ledger_facts.for_ledger(root, "Order")
        out.append((time.process_time() - c0) / repeat * 1e6)
    c0 = time.process_time()
    for _ in range(repeat // 4):
        parse_document(xml, IntakeLimits())
    parse_us = (time.process_time() - c0) / (repeat // 4) * 1e6
    return {
        "best": min(out),
        "median": statistics.median(out),
        "parse": parse_us,
        "bytes": len(ledger_facts.for_ledger(root, "Order").encode()),
    }


# --------------------------------------------------------------------------- main


def tree_cpu(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by this process and its live
    descendants (the JVM, Spark's Python workers): what the load costs,
    whatever else runs on the machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    root = root or os.getpid()
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0))[1]
        todo += [p for p, (ppid, _) in stats.items() if ppid == pid]
    return total / ticks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--orders", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workdir", default="/tmp/etl/bench")
    ap.add_argument("--pretty", action="store_true", help="indented XML, as the OASIS example (default: compact)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--compare-parsers", type=int, default=0, metavar="N",
                    help="also time from_xml / mapInArrow / reader parsing on N documents")  # fmt: skip
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--no-warm", action="store_true", help="do not repeat the load in the warm session")
    ap.add_argument("--skip-reparse", action="store_true", help="do not time the full rebuild from the XML")
    ap.add_argument(
        "--staging",
        default="auto",
        choices=["auto", "true", "false"],
        help="etl.arrow_staging: auto (Arrow on the driver in local mode), true, false (the Data Source)",
    )
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    args = ap.parse_args(argv)

    from spark_etl import config, job
    from spark_etl.session import get_spark

    workdir = Path(args.workdir)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    db, info = cached_ledger(workdir, args.orders, args.seed, args.pretty)
    print(f"ledger: {info['orders']:,} orders, {info['lines']:,} lines, {info['bytes'] / 1e6:,.0f} MB of XML "
          f"(avg {info['bytes'] / info['orders'] / 1024:.1f} KiB/order, {'pretty' if args.pretty else 'compact'}), "
          f"{info['facts_bytes'] / 1e6:,.0f} MB of facts (avg {info['facts_bytes'] / info['orders']:,.0f} B/order), "
          f"{db}", flush=True)  # fmt: skip
    edge = edge_cost()
    print(f"edge (ledger_contract.facts.for_ledger on the tree the gateway parsed): OASIS Order example (2 lines) "
          f"{edge['best']:.1f} us best, {edge['median']:.1f} us median of 7 rounds ({edge['bytes']} B of facts; "
          f"the gateway's parse alone {edge['parse']:.0f} us); generated orders "
          f"{info['edge_us_per_order']:.1f} us/order on average, timed while generating", flush=True)  # fmt: skip
    url = f"sqlite:///{db}"
    wh = workdir / "warehouse"
    if wh.exists():
        shutil.rmtree(wh)
    # a fresh bookkeeping state: the job's tables live in the store, so drop them
    with sqlite3.connect(db) as c:
        for t in ("etl_runs", "etl_quarantine", "etl_lock", "b2b_etl_version"):
            c.execute(f"DROP TABLE IF EXISTS {t}")
    settings = config.resolve(
        {
            "warehouse": str(wh),
            "spark_master": args.master,
            "arrow_staging": args.staging,
            "spark_conf": dict(c.split("=", 1) for c in args.conf),
        }
    )

    t, c = time.perf_counter(), tree_cpu()
    spark = get_spark(settings)
    spark.range(1).count()
    print(
        f"SparkSession ({args.master}) started in {time.perf_counter() - t:.1f}s, CPU {tree_cpu() - c:.1f}s "
        f"(not counted below)",
        flush=True,
    )

    t, c = time.perf_counter(), tree_cpu()
    first = job.run(settings, url, spark=spark)
    t_first = time.perf_counter() - t
    n_lines = first.stats["reconciliation"]["written"]["fact_order_line"]["rows"]
    print(f"ETL first load: {first.loaded:,} orders, {n_lines:,} lines in {t_first:.1f}s = "
          f"{first.loaded / t_first:,.0f} orders/s, {n_lines / t_first:,.0f} lines/s; CPU {tree_cpu() - c:.1f}s, "
          f"load average {os.getloadavg()[0]:.2f}; staging: {first.stats.get('staging')} "
          f"{first.stats.get('stage_seconds') or ''}", flush=True)  # fmt: skip
    print(f"  steps (s): {first.stats.get('seconds')}; writes (s): {first.stats.get('write_seconds')}", flush=True)
    print(f"  Spark jobs per step: {first.stats.get('spark_jobs')}", flush=True)

    t_warm = None
    if not args.no_warm:  # the same load again in the now warm session (JIT, Python workers)
        shutil.rmtree(wh)
        with sqlite3.connect(db) as c:
            c.execute("DELETE FROM etl_runs")
            c.execute("DELETE FROM etl_quarantine")
        t, c = time.perf_counter(), tree_cpu()
        warm = job.run(settings, url, spark=spark)
        t_warm = time.perf_counter() - t
        print(f"ETL same load, warm session: {warm.loaded:,} orders in {t_warm:.1f}s = {warm.loaded / t_warm:,.0f} "
              f"orders/s, {n_lines / t_warm:,.0f} lines/s; CPU {tree_cpu() - c:.1f}s, load average "
              f"{os.getloadavg()[0]:.2f}; staging {warm.stats.get('stage_seconds') or ''}", flush=True)  # fmt: skip
        print(f"  steps (s): {warm.stats.get('seconds')}; writes (s): {warm.stats.get('write_seconds')}", flush=True)
        print(f"  Spark jobs per step: {warm.stats.get('spark_jobs')}", flush=True)

    t = time.perf_counter()
    again = job.run(settings, url, spark=spark)
    t_again = time.perf_counter() - t
    print(f"ETL rerun with nothing new: {t_again:.2f}s ({again.docs_read} documents read) = "
          f"{100 * t_again / (t_warm or t_first):.2f}% of the {'warm' if t_warm else 'first'} load", flush=True)  # fmt: skip

    t_reparse = None
    if not args.skip_reparse:
        t = time.perf_counter()
        rebuilt = job.run(settings, url, spark=spark, full=True, reparse=True)
        t_reparse = time.perf_counter() - t
        print(f"ETL full rebuild from the raw XML (--full --reparse): {rebuilt.loaded:,} orders in {t_reparse:.1f}s = "
              f"{rebuilt.loaded / t_reparse:,.0f} orders/s", flush=True)  # fmt: skip
        print(f"  steps (s): {rebuilt.stats.get('seconds')}", flush=True)

    if not args.skip_baseline:
        t = time.perf_counter()
        base = baseline(db, workdir / "baseline")
        t_base = time.perf_counter() - t
        print(
            f"baseline (1 process, lxml + pyarrow): {base['orders']:,} orders, {base['lines']:,} lines in "
            f"{t_base:.1f}s = {base['orders'] / t_base:,.0f} orders/s, {base['lines'] / t_base:,.0f} lines/s",
            flush=True,
        )
        print(
            f"ETL / baseline throughput: {t_base / t_first:.2f}x (first load)"
            + (f", {t_base / t_warm:.2f}x (warm session)" if t_warm else "")
            + (f"; full rebuild from XML / baseline: {t_base / t_reparse:.2f}x" if t_reparse else ""),
            flush=True,
        )

    if args.compare_parsers:
        res = compare_parsers(spark, url, args.compare_parsers)
        for name, secs in res.items():
            print(f"parse {args.compare_parsers:,} orders with {name}: {secs:.1f}s = "
                  f"{args.compare_parsers / secs:,.0f} orders/s", flush=True)  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
