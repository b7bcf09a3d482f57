"""Benchmark of the ledger's retention: archive and purge rates, the store's size, and the intake during a
purge, on SQLite and on PostgreSQL. Prints, per store, in one run:

1. the gateway's one-way intake (accepted Orders/s over HTTP: ``b2bgw serve`` in a subprocess on the store,
   ``--connections`` keep-alive clients in a closed loop, each order a new document) for ``--seconds``;
2. the archive job (``ledger.retention``, ``after: archive``) over ``--rows`` due ledger rows (plus a tenth as
   many recent ones it keeps), run alone (a subprocess, as ``b2bgw archive run`` would): documents archived
   (written as Parquet, read back and verified) and purged per second;
3. the store's size: before the job, after the purge, and after the vacuum (SQLite: the file, its WAL
   checkpointed, incremental vacuum through the store's writer; PostgreSQL: the database, after a plain
   ``VACUUM``, which makes the space reusable without giving it back), against the size the same content
   takes in a freshly written copy (SQLite: ``VACUUM INTO``);
4. the intake for ``--seconds`` in the state the purge starts from (``--rows`` / 5 more due rows added),
   then while the purge runs (``after: purge``, in another process), counted over the purge's own time span
   only, then for ``--seconds`` after it: the rate during the purge against the mean of the two without
   (they bracket the store's drift over a long purge: its growth, checkpoints, autovacuum).

Goals: archive >= 5,000 documents/s; the SQLite file after the vacuum within 10% of the fresh copy; the
intake during a purge within 10% of its rate without.

The ledger is filled with bulk inserts (a UBL Order of its own id and a note of random words per row, its
OrderResponse, two events, the row as the gateway writes it: LZ4-packed XML, digest, facts).

Usage::

    .venv/bin/python bench/lifecycle_bench.py [--rows 1000000] [--seconds 10] [--connections 64]
                                              [--stores sqlite,postgres] [--keep]

Everything talks to 127.0.0.1 only and stops by itself; PostgreSQL is the test server
(``$B2BGW_TEST_POSTGRES``, default postgresql+psycopg://postgres@127.0.0.1:5432/test), in a schema of its own
that is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway_bench import Connection, ServerProcess, free_port, order_with_id, write_config  # noqa: E402

from ledger_contract.tables import pack_xml  # noqa: E402

REPLY = (REPO.parent / "shared" / "ubl-2.1" / "xml" / "UBL-OrderResponse-2.1-Example.xml").read_bytes()
NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
DAY_MS = 86_400_000
WORDS = (
    "pallet",
    "carton",
    "blue",
    "steel",
    "urgent",
    "dock",
    "gate",
    "north",
    "frozen",
    "spare",
    "bolt",
    "valve",
    "invoice",
    "weekly",
    "ramp",
    "crate",
    "label",
    "batch",
    "return",
    "fragile",
)
FACTS = json.dumps(
    {
        "v": 1,
        "order_id": "x",
        "lines": [{"id": str(i), "qty": "10", "amount": "12.50"} for i in range(8)],
        "buyer": "GLN:7300072311115",
    }
)
PG_URL = os.environ.get("B2BGW_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
COLUMNS = (
    "message_id",
    "partner",
    "doc_type",
    "doc_namespace",
    "doc_id",
    "idempotency_key",
    "correlation_id",
    "route",
    "destination",
    "status",
    "received_at",
    "updated_at",
    "document",
    "reply",
    "reply_type",
    "receipt",
    "facts",
    "facts_version",
    "digest",
)


def rows(start: int, count: int, days_ago: float, rng: random.Random) -> Any:
    """``(ledger row, [events])`` of *count* replied orders received *days_ago* days ago."""
    base = int(time.time() * 1000 - days_ago * DAY_MS)
    reply = pack_xml(REPLY)
    for k in range(start, start + count):
        note = " ".join(rng.choice(WORDS) for _ in range(12))
        body = order_with_id(f"LC-{k}").replace(b"Information text for the whole order", note.encode(), 1)
        at = base + k
        mid = f"ID:bench-{k:09d}"
        receipt = json.dumps({"message_id": mid, "status": "accepted", "status_url": f"/v1/documents/{mid}"})
        yield (
            (
                mid,
                "acme",
                "Order",
                NS,
                f"LC-{k}",
                f"acme|Order|LC-{k}",
                f"c-{k}",
                "ubl-order",
                "queue://orders.inbound",
                "replied",
                at,
                at + 40,
                pack_xml(body),
                reply,
                "OrderResponse",
                receipt,
                FACTS,
                1,
                "sha256:" + hashlib.sha256(body).hexdigest(),
            ),
            [(mid, "accepted", at), (mid, "replied", at + 40)],
        )


def fill(url: str, start: int, count: int, days_ago: float, seed: int) -> float:
    """Bulk-insert *count* rows; seconds taken."""
    rng = random.Random(seed)
    t = time.perf_counter()
    if url.startswith("sqlite"):
        import sqlite3

        conn = sqlite3.connect(url.split("///", 1)[1], isolation_level=None)
        conn.execute("PRAGMA synchronous=OFF")
        docs, evs = [], []
        insert = f"INSERT INTO b2b_ledger ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"

        def flush() -> None:
            conn.execute("BEGIN")
            conn.executemany(insert, docs)
            conn.executemany("INSERT INTO b2b_ledger_events (message_id, status, at) VALUES (?, ?, ?)", evs)
            conn.execute("COMMIT")
            docs.clear()
            evs.clear()

        for row, events in rows(start, count, days_ago, rng):
            docs.append(row)
            evs.extend(events)
            if len(docs) >= 10_000:
                flush()
        if docs:
            flush()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    else:
        import psycopg

        dsn, schema = _pg(url)
        with psycopg.connect(dsn, options=f"-csearch_path={schema}") as conn:
            batch: list[Any] = []
            for row, events in rows(start, count, days_ago, rng):
                batch.append((row, events))
                if len(batch) >= 20_000:
                    _pg_copy(conn, batch)
            if batch:
                _pg_copy(conn, batch)
            conn.execute("ANALYZE b2b_ledger")
            conn.execute("ANALYZE b2b_ledger_events")
            conn.commit()
    return time.perf_counter() - t


def _pg_copy(conn: Any, batch: list[Any]) -> None:
    with conn.cursor() as cur:
        with cur.copy(f"COPY b2b_ledger ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row, _ in batch:
                copy.write_row(row)
        with cur.copy("COPY b2b_ledger_events (message_id, status, at) FROM STDIN") as copy:
            for _, events in batch:
                for event in events:
                    copy.write_row(event)
    conn.commit()
    batch.clear()


def _pg(url: str) -> tuple[str, str]:
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    schema = str(parsed.query["schema"])
    return parsed.difference_update_query(["schema"]).render_as_string(hide_password=False).replace(
        "postgresql+psycopg://", "postgresql://"
    ), schema


# --------------------------------------------------------------------------- sizes


def size(url: str) -> int:
    if url.startswith("sqlite"):
        import sqlite3

        path = url.split("///", 1)[1]
        conn = sqlite3.connect(path, isolation_level=None, timeout=60)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        conn.close()
        return os.path.getsize(path)
    import psycopg

    dsn, schema = _pg(url)
    with psycopg.connect(dsn) as conn:
        return int(
            conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()[0]
        )


def fresh_copy_size(url: str, folder: Path) -> int | None:
    """SQLite: the size of the same content written afresh (VACUUM INTO)."""
    if not url.startswith("sqlite"):
        return None
    import sqlite3

    copy = folder / "fresh-copy.db"
    if copy.exists():
        copy.unlink()
    conn = sqlite3.connect(url.split("///", 1)[1], isolation_level=None, timeout=60)
    conn.execute("VACUUM INTO ?", (str(copy),))
    conn.close()
    n = copy.stat().st_size
    copy.unlink()
    return n


def pg_vacuum(url: str) -> None:
    import psycopg

    dsn, schema = _pg(url)
    with psycopg.connect(dsn, autocommit=True, options=f"-csearch_path={schema}") as conn:
        for table in ("b2b_ledger", "b2b_ledger_events", "b2b_ledger_tombstones"):
            conn.execute(f"VACUUM {table}")


# --------------------------------------------------------------------------- the job, in a process of its own


def worker(url: str, root: str, after: str, vacuum: bool) -> None:
    """``--worker``: run the archive job once on the store and print what it did as JSON."""
    from broker_core import Broker
    from gateway.ledger.records import upgrade_ledger
    from ledger_contract.retention import RetentionPolicy, Rule
    from spark_etl import archive

    broker = Broker.open(url, sweep_interval=0)
    try:
        upgrade_ledger(broker.engine)
        policy = RetentionPolicy(default=Rule(90 * 86400.0, after), batch=5000)
        t0 = time.time()
        result = archive.run(
            policy,
            engine=broker.engine,
            write=archive.store_writer(broker),
            purge_write=archive.store_writer(broker, durable=False),
            root=root,
            wait_for_warehouse=False,
            vacuum=False,
        )
        t1 = time.time()
        vacuumed = 0.0
        if vacuum:
            from ledger_contract.space import vacuum as give_back

            v = time.perf_counter()
            result.vacuumed_pages = give_back(broker.engine, archive.store_writer(broker, durable=False))
            vacuumed = time.perf_counter() - v
    finally:
        broker.close()
    print(
        json.dumps(
            {
                "start": t0,
                "end": t1,
                "archived": result.archived,
                "purged": result.purged,
                "bytes": result.bytes,
                "seconds": result.seconds,
                "vacuumed_pages": result.vacuumed_pages,
                "vacuum_seconds": vacuumed,
            }
        )
    )


def run_worker(url: str, root: Path, after: str, vacuum: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", url, str(root), after, str(int(vacuum))],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(REPO),
    )


# --------------------------------------------------------------------------- intake load


async def load(port: int, key: str, seconds: float, connections: int, until: Any = None) -> list[float]:
    """Closed-loop one-way orders; the completion time (epoch s) of each accepted one. With *until* (a
    function), also stop once it says so."""
    done: list[float] = []
    deadline = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/xml"}
    counter = iter(range(10**9))
    tag = uuid.uuid4().hex[:8]

    async def one() -> None:
        conn = Connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline and not (until is not None and until()):
                status, _ = await conn.post("/v1/documents", headers, order_with_id(f"IN-{tag}-{next(counter)}"))
                if status == 202:
                    done.append(time.time())
        finally:
            await conn.close()

    await asyncio.gather(*[one() for _ in range(connections)])
    return done


def rate_within(done: list[float], start: float, end: float) -> float:
    return sum(1 for t in done if start <= t <= end) / max(end - start, 1e-9)


# --------------------------------------------------------------------------- one store


def bench_store(kind: str, url: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    from broker_core import Broker
    from gateway.ledger.records import upgrade_ledger
    from gateway.routing.partners import generate_key

    out: dict[str, Any] = {"store": kind, "rows": args.rows}
    broker = Broker.open(url, sweep_interval=0, auto_upgrade=True)  # creates and migrates the store
    upgrade_ledger(broker.engine)
    broker.close()
    kept = max(1, args.rows // 10)
    out["fill_s"] = fill(url, 0, args.rows, 100, 1) + fill(url, args.rows, kept, 1, 2)

    key = generate_key("bench")
    config = write_config(folder, key)
    data = yaml.safe_load(config.read_text())
    data["store"]["url"] = url
    if not url.startswith("sqlite"):
        data["store"]["options"].pop("sqlite_synchronous", None)
    data["workers"] = []
    data["stomp"] = {"enabled": False}
    data["ledger"] = {"retention": {"online": "90d", "enabled": False}}  # the bench runs the job itself
    for entry in (data.get("rules") or {}).get("sets", {}).values():  # relative to config/, which is not here
        entry["file"] = str((REPO / "config" / entry["file"]).resolve())
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    port = free_port()
    server = ServerProcess(config, port, folder / f"server-{kind}.log")
    try:
        server.wait_ready()
        asyncio.run(load(port, key, 2, args.connections))  # warm-up
        done = asyncio.run(load(port, key, args.seconds, args.connections))
        out["intake_alone"] = len(done) / args.seconds

        out["size_before"] = size(url)
        proc = run_worker(url, folder / f"archive-{kind}", "archive", False)
        result = json.loads(proc.communicate()[0])
        out["archive"] = result
        out["archive_rate"] = result["purged"] / result["seconds"] if result["seconds"] else 0.0
        out["size_after_purge"] = size(url)
        if url.startswith("sqlite"):
            proc = run_worker(url, folder / f"archive-{kind}", "archive", True)  # nothing due: the vacuum alone
            vacuumed = json.loads(proc.communicate()[0])
            out["vacuum"] = {"pages": vacuumed["vacuumed_pages"], "seconds": vacuumed["vacuum_seconds"]}
        else:
            t = time.perf_counter()
            pg_vacuum(url)
            out["vacuum"] = {"seconds": time.perf_counter() - t}
        out["size_after_vacuum"] = size(url)
        out["size_fresh_copy"] = fresh_copy_size(url, folder)

        # 4. the intake while a purge runs
        extra = max(1000, args.rows // 5)
        fill(url, 10 * args.rows, extra, 100, 3)
        # the rate without, in the state the purge starts from (the archive and the vacuum changed the store)
        done = asyncio.run(load(port, key, args.seconds, args.connections))
        out["intake_before_purge"] = len(done) / args.seconds
        finished = [False]
        proc = run_worker(url, folder / f"archive-{kind}", "purge", False)

        async def during() -> list[float]:
            async def watch() -> None:
                while proc.poll() is None:
                    await asyncio.sleep(0.05)
                finished[0] = True

            watcher = asyncio.ensure_future(watch())
            got = await load(port, key, 3600, args.connections, until=lambda: finished[0])
            await watcher
            return got

        done = asyncio.run(during())
        purge = json.loads(proc.communicate()[0])
        out["purge"] = purge
        out["intake_during_purge"] = rate_within(done, purge["start"], purge["end"])
        # and after it: a long purge spans the store's own drift (its growth, checkpoints, autovacuum)
        done = asyncio.run(load(port, key, args.seconds, args.connections))
        out["intake_after_purge"] = len(done) / args.seconds
        out["purge_rate"] = purge["purged"] / purge["seconds"] if purge["seconds"] else 0.0
    finally:
        server.stop()
    return out


def report(r: dict[str, Any]) -> None:
    mb = 1 << 20
    print(
        f"\n== {r['store']}: {r['rows']:,} due ledger rows (+{max(1, r['rows'] // 10):,} kept), filled in "
        f"{r['fill_s']:.0f}s"
    )
    a = r["archive"]
    print(f"1. intake alone:               {r['intake_alone']:8.0f} accepted orders/s")
    print(
        f"2. archive + purge:            {r['archive_rate']:8.0f} documents/s ({a['purged']:,} in {a['seconds']:.1f}s, "
        f"{a['bytes'] / mb:.0f} MB of Parquet, {a['bytes'] / max(a['archived'], 1):.0f} bytes/document)"
        f"   goal >= 5,000: {'met' if r['archive_rate'] >= 5000 else 'NOT met'}"
    )
    print(f"3. store size before:          {r['size_before'] / mb:8.0f} MB")
    print(f"   after the purge:            {r['size_after_purge'] / mb:8.0f} MB")
    v = r["vacuum"]
    print(
        f"   after the vacuum:           {r['size_after_vacuum'] / mb:8.0f} MB ({v.get('pages', '-')} pages in "
        f"{v['seconds']:.1f}s)"
    )
    if r["size_fresh_copy"]:
        ratio = r["size_after_vacuum"] / r["size_fresh_copy"]
        print(
            f"   the same content afresh:    {r['size_fresh_copy'] / mb:8.0f} MB: after the vacuum x{ratio:.3f}"
            f"   goal <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'}"
        )
    before, after = r["intake_before_purge"], r["intake_after_purge"]
    without = (before + after) / 2
    ratio = r["intake_during_purge"] / without if without else 0.0
    p = r["purge"]
    print(f"4. intake just before a purge: {before:8.0f} accepted orders/s (x{before / r['intake_alone']:.3f} of 1.)")
    print(
        f"   intake during the purge:    {r['intake_during_purge']:8.0f} accepted orders/s (the purge: "
        f"{p['purged']:,} documents in {p['seconds']:.1f}s, {r['purge_rate']:.0f}/s)"
    )
    print(f"   intake just after it:       {after:8.0f} accepted orders/s")
    print(
        f"   during / without (the mean of before and after): x{ratio:.3f}"
        f"   goal >= 0.90: {'met' if ratio >= 0.90 else 'NOT met'}"
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == "1")
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="due ledger rows (default 1,000,000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the intake measure (s)")
    parser.add_argument("--connections", type=int, default=64, help="concurrent intake clients")
    parser.add_argument("--stores", default="sqlite,postgres", help="sqlite, postgres or both")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="b2bgw-lifecycle-"))
    results = []
    try:
        for kind in args.stores.split(","):
            if kind == "sqlite":
                results.append(bench_store(kind, f"sqlite:///{folder / 'bench.db'}", folder, args))
            elif kind == "postgres":
                import psycopg

                schema = f"lc_bench_{uuid.uuid4().hex[:8]}"
                dsn = PG_URL.replace("postgresql+psycopg://", "postgresql://")
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f'CREATE SCHEMA "{schema}"')
                try:
                    sep = "&" if "?" in PG_URL else "?"
                    results.append(bench_store(kind, f"{PG_URL}{sep}schema={schema}", folder, args))
                finally:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
            else:
                parser.error(f"unknown store {kind!r}")
            report(results[-1])
    finally:
        if args.keep:
            print(f"\nworking folder kept: {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    print("\n" + json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
