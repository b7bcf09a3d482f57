"""Benchmark of the operations side: the console, the admin API and /metrics on a big store. One run prints,
for SQLite and for PostgreSQL:

1. the time to fill the store with 1,000 queues and 1,000,000 waiting messages (direct bulk inserts into the
   store's tables: half in one deep queue, the rest spread over 999 others);
2. p99 (and p50) of the console's overview page, of a browse page deep in the deep queue (keyset cursors
   300,000 to 490,000 messages in) and of a ``/metrics`` scrape: goal, each under 100 ms;
3. the gateway's one-way rate (UBL Orders accepted per second, closed loop of 32 clients) without any
   scraping, then while ``/metrics`` is scraped every 5 s (which keeps the admin sampler reading the
   store's counters every ``admin.stats_interval``, 5 s), ``--rounds`` times each, alternating, and the
   medians compared: goal, under 2% apart;

then the cost of the metrics on the intake's hot path (the observer around one request, in this process),
and a screenshot of the console's overview on the big store (a PNG in a temporary folder: its path is
printed, with what it shows).

Usage::

    .venv/bin/python bench/ops_bench.py [--messages 1000000] [--destinations 1000] [--seconds 15] [--rounds 3]
                                        [--only sqlite|postgres] [--no-screenshot]

The server is ``b2bgw serve`` in a subprocess on 127.0.0.1 (see bench/gateway_bench.py); PostgreSQL is the
test server (``B2BGW_TEST_POSTGRES``), in a schema made for the run and dropped after it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway_bench import ServerProcess, closed_loop, free_port, order_with_id, write_config

from gateway.routing.partners import hash_key

POSTGRES_URL = os.environ.get("B2BGW_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BENCH_KEY = "bench." + "k" * 43
OPERATOR = ("bench-operator", "bench-operator-secret")
BODY = (
    '<Invoice xmlns="urn:oasis:names:specification:ubl:schema:xsd:Invoice-2" '
    'xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">'
    "<cbc:ID>{}</cbc:ID><cbc:IssueDate>2025-06-01</cbc:IssueDate></Invoice>"
)
DEEP = "bench.q0000"


# --------------------------------------------------------------------------- filling the store


def rows(messages: int, destinations: int, now_us: int):
    """(message row, entry row) tuples: half the messages in DEEP, the rest round robin over the others."""
    half = messages // 2
    for i in range(1, messages + 1):
        box = DEEP if i <= half else f"bench.q{1 + (i % (destinations - 1)):04d}"
        mid = f"ID:bench-{i}"
        message = (
            i,
            mid,
            f"queue://{box}",
            2,
            now_us // 1000,
            f"corr-{i}",
            None,
            "Invoice",
            f'{{"partner":"bench","InvoiceID":"INV-{i}"}}',
            "xml",
            BODY.format(i).encode(),
            None,
        )
        entry = (i, f"queue://{box}", now_us + i, 4, 0, 0, 0, None, 0, i)
        yield message, entry


MESSAGE_COLS = (
    "id, message_id, destination, delivery_mode, timestamp, correlation_id, reply_to, type, "
    "properties, kind, body, origin"
)
ENTRY_COLS = "id, box, seq, priority, expiration, state, ready_at, owner, delivery_count, message"


def fill_sqlite(path: Path, messages: int, destinations: int) -> None:
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous=OFF")
    now_us = time.time_ns() // 1000 - messages
    batch_m, batch_e = [], []

    def flush() -> None:
        db.executemany(f"INSERT INTO b2b_messages ({MESSAGE_COLS}) VALUES ({', '.join('?' * 12)})", batch_m)
        db.executemany(f"INSERT INTO b2b_entries ({ENTRY_COLS}) VALUES ({', '.join('?' * 10)})", batch_e)
        db.commit()
        batch_m.clear()
        batch_e.clear()

    for message, entry in rows(messages, destinations, now_us):
        batch_m.append(message)
        batch_e.append(entry)
        if len(batch_m) >= 50_000:
            flush()
    flush()
    # the store keeps each box's count (b2b_box_depth): rows written behind its back are counted here
    db.execute(
        "INSERT INTO b2b_box_depth (instance, box, entries) SELECT '', box, count(*) FROM b2b_entries "
        "GROUP BY box ON CONFLICT (instance, box) DO UPDATE SET entries = excluded.entries"
    )
    db.commit()
    db.execute("ANALYZE")
    db.commit()
    db.close()


def fill_postgres(url: str, schema: str, messages: int, destinations: int) -> None:
    import psycopg

    dsn = url.split("?")[0].replace("postgresql+psycopg://", "postgresql://")
    now_us = time.time_ns() // 1000 - messages
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY b2b_messages ({MESSAGE_COLS}) FROM STDIN") as copy_m:
                for message, _ in rows(messages, destinations, now_us):
                    copy_m.write_row(message)
            with cur.copy(f"COPY b2b_entries ({ENTRY_COLS}) FROM STDIN") as copy_e:
                for _, entry in rows(messages, destinations, now_us):
                    copy_e.write_row(entry)
            cur.execute(
                "INSERT INTO b2b_box_depth (instance, box, entries) SELECT '', box, count(*) "
                "FROM b2b_entries GROUP BY box ON CONFLICT (instance, box) DO UPDATE SET "
                "entries = excluded.entries"
            )
            for table in ("b2b_messages", "b2b_entries"):
                cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            cur.execute("ANALYZE b2b_messages")
            cur.execute("ANALYZE b2b_entries")
        conn.commit()


def deep_cursors(url: str, schema: str | None, count: int, messages: int) -> list[str]:
    """Browse cursors from 300,000 (scaled) messages into DEEP onwards (read once, before the timing)."""
    import sqlalchemy as sa

    engine = sa.create_engine(
        url.split("?")[0] if schema else url, connect_args={"options": f"-c search_path={schema}"} if schema else {}
    )
    first = int(messages * 0.3)
    last = int(messages * 0.49)
    step = max(1, (last - first) // count)
    out = []
    with engine.connect() as conn:
        for i in range(count):
            row = conn.execute(
                sa.text("SELECT priority, seq, id FROM b2b_entries WHERE box = :box AND state = 0 AND id = :id"),
                {"box": f"queue://{DEEP}", "id": first + i * step},
            ).first()
            if row is not None:
                out.append(f"0.{9 - row.priority}.{row.seq}.{row.id}")
    engine.dispose()
    return out


# --------------------------------------------------------------------------- measuring


def p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def timed(client: httpx.Client, url: str, n: int, params_for=None, expect: int = 200) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        r = client.get(url, params=params_for(i) if params_for else None)
        out.append((time.perf_counter() - started) * 1000)
        if r.status_code != expect:
            raise RuntimeError(f"{url}: HTTP {r.status_code}: {r.text[:200]}")
    return out


def line(name: str, ms: list[float]) -> str:
    verdict = "met" if p(ms, 0.99) < 100 else "NOT met"
    return f"  {name:<34} p50 {p(ms, 0.5):7.1f} ms   p99 {p(ms, 0.99):7.1f} ms   ({len(ms)} requests; goal <100 ms: {verdict})"


def one_way(base: str, seconds: float, scrape: bool) -> tuple[float, int]:
    """Orders per second, closed loop of 32 clients; with *scrape*, GET /metrics every 5 s meanwhile."""
    headers = {"Authorization": f"Bearer {BENCH_KEY}", "Content-Type": "application/xml"}
    stop = threading.Event()
    scrapes = [0]

    def scraper() -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            while not stop.is_set():
                client.get("/metrics")
                scrapes[0] += 1
                stop.wait(5.0)

    thread = threading.Thread(target=scraper, daemon=True) if scrape else None
    if thread is not None:
        thread.start()
    prefix = uuid.uuid4().hex[:8]
    result = asyncio.run(
        closed_loop(base + "/v1/documents", headers, seconds, 32, lambda i: order_with_id(f"OPS-{prefix}-{i}"), 202)
    )
    stop.set()
    if thread is not None:
        thread.join(10)
    return result["rate"], scrapes[0]


def hot_path_cost() -> tuple[float, float]:
    """Microseconds the metrics observer adds around one request (an accepted one-way document)."""
    from gateway.telemetry.logs import set_partner
    from gateway.telemetry.metrics import HttpMetrics

    observer = HttpMetrics({"acme"})
    start = {
        "type": "http.response.start",
        "status": 202,
        "headers": [
            (b"x-message-id", b"ID:1"),
            (b"x-correlation-id", b"c"),
            (b"x-route-id", b"ubl-order"),
            (b"content-type", b"application/json"),
            (b"content-length", b"80"),
        ],
    }
    body = {"type": "http.response.body", "body": b"x" * 80}
    scope = {"type": "http", "method": "POST", "path": "/v1/documents"}

    async def send(message: object) -> None:
        return None

    async def dispatch(scope: object, receive: object, send_: object) -> None:
        set_partner("acme")
        await send_(start)
        await send_(body)

    async def bare(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            await dispatch(scope, None, send)
        return time.perf_counter() - t

    async def observed(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            await observer(scope, None, send, dispatch)
        return time.perf_counter() - t

    async def run() -> tuple[float, float]:
        n = 50_000
        await observed(1000)
        bare_s = min([await bare(n) for _ in range(3)])
        observed_s = []
        for _ in range(3):
            took = await observed(n)
            flushed = time.perf_counter()
            observer.flush()  # what the background thread does with them, counted too
            observed_s.append(took + time.perf_counter() - flushed)
        return bare_s / n * 1e6, min(observed_s) / n * 1e6

    return asyncio.run(run())


# --------------------------------------------------------------------------- one store


def run_store(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, object]:
    config_path = write_config(folder, BENCH_KEY)
    config = yaml.safe_load(config_path.read_text())
    schema = None
    if kind == "postgres":
        import psycopg

        schema = f"ops_{uuid.uuid4().hex[:10]}"
        dsn = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        sep = "&" if "?" in POSTGRES_URL else "?"
        config["store"]["url"] = f"{POSTGRES_URL}{sep}schema={schema}"
        config["store"]["options"].pop("sqlite_synchronous", None)
    url = config["store"]["url"]
    config["operators"] = {OPERATOR[0]: {"role": "operator", "hash": hash_key(OPERATOR[1], ln=10)}}
    config["admin"] = {"stats_interval": "5s", "metrics_on_partner_port": True}  # scraped without credentials
    config["workers"] = []
    config["stomp"] = {"enabled": False}
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    out: dict[str, object] = {"store": kind}
    try:
        from gateway.cli.main import main as cli

        if cli(["db", "upgrade", "--url", url]) != 0:
            raise RuntimeError("db upgrade failed")
        started = time.perf_counter()
        if kind == "sqlite":
            fill_sqlite(Path(url[len("sqlite:///") :]), args.messages, args.destinations)
        else:
            fill_postgres(url, schema, args.messages, args.destinations)
        out["fill_s"] = time.perf_counter() - started
        print(
            f"{kind}: filled {args.messages:,} messages in {args.destinations:,} queues in {out['fill_s']:.1f} s",
            flush=True,
        )
        cursors = deep_cursors(url, schema, args.requests, args.messages)
        port = free_port()
        server = ServerProcess(config_path, port, folder / f"server-{kind}.log")
        try:
            server.wait_ready(timeout=120)
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=60) as client:
                r = client.post("/admin/api/v1/session", json={"name": OPERATOR[0], "secret": OPERATOR[1]})
                r.raise_for_status()
                started = time.perf_counter()
                client.get("/console").raise_for_status()  # the first look waits for the first reading
                out["first_reading_ms"] = (time.perf_counter() - started) * 1000
                client.get("/metrics").raise_for_status()
                out["overview"] = timed(client, "/console", args.requests)
                out["browse"] = timed(
                    client,
                    "/admin/api/v1/messages",
                    args.requests,
                    lambda i: {"destination": f"queue://{DEEP}", "cursor": cursors[i % len(cursors)], "limit": "50"},
                )
                out["metrics"] = timed(client, "/metrics", args.requests)
                if args.screenshot:
                    out["screenshot"] = screenshot(base, client.cookies.get("b2bgw_session"), folder, kind)
            rates = []
            for scrape in [False, True] * args.rounds:
                rate, scrapes = one_way(base, args.seconds, scrape)
                rates.append((scrape, rate, scrapes))
                print(
                    f"  one-way {'with' if scrape else 'without'} scraping: {rate:7.1f} orders/s"
                    + (f" ({scrapes} scrapes)" if scrape else ""),
                    flush=True,
                )
            out["rates"] = rates
        finally:
            server.stop()
    finally:
        if schema is not None:
            import psycopg

            with psycopg.connect(
                POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
            ) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return out


def screenshot(base: str, session: str | None, folder: Path, kind: str) -> str | None:
    """The overview in headless chromium (Playwright, /usr/bin/chromium), as a PNG; its path."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").exists() or session is None:
        return None
    path = Path(tempfile.gettempdir()) / f"b2bgw-console-{kind}-{uuid.uuid4().hex[:6]}.png"
    args = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=args)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_cookies([{"name": "b2bgw_session", "value": session, "url": base}])
        page = context.new_page()
        page.goto(base + "/console")
        page.screenshot(path=str(path))
        browser.close()
    return str(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--destinations", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=60, help="timed requests of each kind (default 60)")
    parser.add_argument("--seconds", type=float, default=15.0, help="each one-way phase (default 15)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="one-way phases without then with scraping, alternating, this many times each (default 3)",
    )
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--no-screenshot", dest="screenshot", action="store_false")
    args = parser.parse_args()
    results = []
    for kind in ("sqlite", "postgres"):
        if args.only and kind != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"ops-bench-{kind}-") as folder:
            results.append(run_store(kind, args, Path(folder)))
    bare_us, observed_us = hot_path_cost()
    print()
    print(f"== operations benchmark: {args.destinations:,} queues, {args.messages:,} waiting messages ==")
    for r in results:
        print(
            f"{r['store']}: filled in {r['fill_s']:.1f} s; first reading of the counters {r['first_reading_ms']:.0f} ms"
        )
        print(line("console overview", r["overview"]))
        print(line("browse page deep in the queue", r["browse"]))
        print(line("/metrics scrape", r["metrics"]))
        without = [rate for scrape, rate, _ in r["rates"] if not scrape]
        with_ = [rate for scrape, rate, _ in r["rates"] if scrape]
        a, b = statistics.median(without), statistics.median(with_)  # medians: this machine's speed drifts
        gap = abs(a - b) / a * 100 if a else 0.0
        print(
            f"  one-way rate: {a:.1f} orders/s without scraping, {b:.1f} with /metrics every 5 s: "
            f"{gap:.1f}% apart (goal <2%: {'met' if gap < 2 else 'NOT met'}; runs: "
            + ", ".join(f"{rate:.1f}{'*' if scrape else ''}" for scrape, rate, _ in r["rates"])
            + "; * scraped)"
        )
        if r.get("screenshot"):
            print(f"  screenshot of the overview: {r['screenshot']}")
    print(
        f"metrics on the intake's hot path: {observed_us - bare_us:.2f} us per request "
        f"(a request through the observer {observed_us:.2f} us, without {bare_us:.2f} us)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
