"""Benchmark of the gateway under hostile documents, driven over loopback. Prints, in one run:

0. the cost of the intake limit checks on the UBL Order example (14 KB): its parse, in one process, with
   and without the checks (``gateway.intake.scan._check_markup``), interleaved rounds, and the checks alone;
1. honest clients alone: ``--honest`` clients (16) posting valid UBL Orders, each a fresh ``cbc:ID``, on the
   request-reply route answered by the sample order responder, paced at ``--rate`` requests/s in all:
   p50 / p99 latency and errors; ``/healthz`` polled every 100 ms meanwhile (its slowest answer); the store's
   commits over 100 ms. It follows ``--warm-up`` seconds (10) of the same load, not measured: a new server's
   first seconds are slower (on the sample, the first 10 s had up to twice the p50 and seven to eight times
   the p99 of the next), which would set the quiet tail rather than the server's steady state;
2. each hostile class alone: the answer time and problem code of one document per class (every one up to
   the 10 MiB body limit): many attributes, many namespace declarations (on one element, in the document),
   long names, a huge text node, thousands of validation errors (large, on siblings, small), a combination,
   the billion laughs, and a large valid invoice;
3. both at once: the same honest clients while ``--hostile`` clients (16) send the hostile classes back to
   back: the honest p50 / p99 and errors again, every hostile answer's time (the slowest per class), the
   slowest ``/healthz``, and the store commits the server logged as slow meanwhile;
4. floods of wrong keys (``--flood-seconds`` each, ``--flooders`` clients): random secrets with a public
   key id, posted back to back while the same honest clients run: ``known-id-one-address`` (the ``acme-demo``
   id from 127.0.0.1: throttled after 20 failures), ``known-id-many-addresses`` (the same id from a new
   127.x.y.z address each time, so the per-address throttle never applies: every refusal is an HMAC check
   of a migrated key) and ``unused-scrypt-key-many-addresses`` (the id of a scrypt-hashed key no request
   has used, which cannot be migrated: its checks are scrypt, queued up to their bound, beyond it 503).
   Honest p50 / p99 and errors, the answers' statuses, the server's CPU, and the goals: honest p99 within 3x
   quiet, every honest request answered.

4. with ``--stomp-flood``: the same honest clients while ``bench/stomp_flood.py`` floods the STOMP listener
   the server runs beside the gateway (connections that never CONNECT, megabytes before CONNECT, wrong
   passcodes, an authenticated user's non-persistent messages to an unread queue and a transaction never
   committed): the honest p50 / p99 and errors, and the ERROR frames the flood got, by kind.
Goals: every hostile answer (2) and (3) within 2 s with its own problem code (in (3), or 429: the hostile
partner is over its limits); in (3) the honest clients see no error and a p99 within 3x their p99 of (1);
``/healthz`` within 100 ms; in (4) the same for the honest clients. In (3) the hostile partner has the limits an operator gives a partner
(``--hostile-limits``: 2 requests in progress and 20 a second by default; the number in progress alone
bounds the large documents' work, not the rate of the cheap ones, refused in a millisecond each); the
honest one keeps the generous defaults.

Usage::

    .venv/bin/python bench/hostile_bench.py [--seconds 20] [--honest 16] [--hostile 16] [--rate 40]
        [--classes invoice] [--store-dir /dev/shm] [--set server.intake_workers=1 ...]
        [--flood-seconds 15] [--flooders 32] [--floods-only]

The server is ``b2bgw serve`` in a subprocess (one process, the sample configuration on a fresh SQLite store
in a temporary folder, the sample order responder in-process). The honest and the hostile clients run in
processes of their own, so that neither's client work shows in the other's figures. Everything talks to
127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import timeit
import uuid
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import stomp_flood  # noqa: E402
from gateway_bench import Connection, ServerProcess, free_port, sample_config  # noqa: E402

from broker_core.stomp import hash_passcode  # noqa: E402
from gateway.intake import parse as intake_parse  # noqa: E402
from gateway.intake import xmlsafe as xmlintake  # noqa: E402

UBL = REPO.parent / "shared" / "ubl-2.1" / "xml"
ORDER = (UBL / "UBL-Order-2.1-Example.xml").read_bytes()
INVOICE = (UBL / "UBL-Invoice-2.1-Example.xml").read_bytes()
ACME = {
    "Authorization": "Bearer acme-demo.EOSR0zYti7vSYAzgLvqVss8uQCIXEmWO3fDuUsmKiIA",
    "Content-Type": "application/xml",
}
GLOBEX = {
    "Authorization": "Bearer globex-demo.gtQ0VQHxnHu2x3aBBqlE_TqHsM5svX9Dzw52xGagUfA",
    "Content-Type": "application/xml",
}
BUDGET = 2.0


def order_with_id(order_id: str) -> bytes:
    head, tail = ORDER.split(b"<cbc:ID>34</cbc:ID>", 1)
    return head + b"<cbc:ID>" + order_id.encode() + b"</cbc:ID>" + tail


# --------------------------------------------------------------------------- the hostile documents


def _invoice_lines(n: int, quantity: bytes, line: bytes | None = None) -> bytes:
    text = INVOICE
    start = text.index(b"<cac:InvoiceLine>")
    end = text.rindex(b"</cac:InvoiceLine>") + len(b"</cac:InvoiceLine>")
    if line is None:
        line = (
            b'<cac:InvoiceLine><cbc:ID>1</cbc:ID><cbc:InvoicedQuantity unitCode="C62">'
            + quantity
            + b'</cbc:InvoicedQuantity><cbc:LineExtensionAmount currencyID="EUR">1</cbc:LineExtensionAmount>'
            b'<cac:Item><cbc:Name>n</cbc:Name></cac:Item><cac:Price><cbc:PriceAmount currencyID="EUR">1'
            b"</cbc:PriceAmount></cac:Price></cac:InvoiceLine>\n"
        )
    return text[:start] + line * n + text[end:]


def _root_with(attributes: bytes) -> bytes:
    return INVOICE.replace(b"<Invoice ", b"<Invoice " + attributes + b" ", 1)


def _note(text: bytes) -> bytes:
    return INVOICE.replace(b"<cbc:Note>", b"<cbc:Note>" + text, 1)


def hostile_documents() -> dict[str, tuple[bytes, int, str]]:
    """name -> (body, expected status, expected problem code or '')."""
    attrs = b" ".join(b'a%d="v"' % i for i in range(100_000))
    decls = b" ".join(b'xmlns:p%d="urn:x:%d"' % (i, i) for i in range(50_000))
    spread = b"".join(b'<cbc:Note xmlns:q="urn:q">n</cbc:Note>' for _ in range(120_000))
    first_line = INVOICE[INVOICE.index(b"<cac:InvoiceLine>") : INVOICE.index(b"</cac:InvoiceLine>") + 18]
    big_valid = _invoice_lines(9 * 1024 * 1024 // len(first_line) - 4, b"", first_line)
    siblings = INVOICE.replace(b"<cbc:Note>", b'<cbc:Note x="1"/>' * 11_000 + b"<cbc:Note>", 1)
    small = INVOICE.replace(b"<cbc:Note>", b'<cbc:Note x="1"/>' * 200 + b"<cbc:Note>", 1)
    return {
        "100,000 attributes on one element (1.3 MB)": (_root_with(attrs), 400, "too-many-attributes"),
        "50,000 namespace declarations on one element": (_root_with(decls), 400, "too-many-namespaces"),
        "120,000 namespace declarations in all (4.6 MB)": (
            INVOICE.replace(b"<cbc:Note>", spread + b"<cbc:Note>", 1),
            400,
            "too-many-document-namespaces",
        ),
        "a 5 MB element name": (
            INVOICE.replace(b"<cbc:Note>", b"<cbc:" + b"N" * 5_000_000 + b"/><cbc:Note>", 1),
            400,
            "name-too-long",
        ),
        "a 9 MB text node": (_note(b"x" * 9_000_000), 400, "text-too-long"),
        "20,000 validation errors (3.5 MB)": (_invoice_lines(20_000, b"abc"), 400, "schema-invalid"),
        "11,000 errors on sibling elements (200 KB)": (siblings, 400, "schema-invalid"),
        "200 validation errors (24 KB)": (small, 400, "schema-invalid"),
        "100,000 attributes and a 9 MB text": (
            _root_with(attrs).replace(b"<cbc:Note>", b"<cbc:Note>" + b"x" * 8_000_000, 1),
            400,
            "too-many-attributes",
        ),
        "billion laughs": (
            (REPO / "tests" / "gateway" / "fixtures" / "billion-laughs.xml").read_bytes(),
            400,
            "forbidden-xml",
        ),
        "a valid 9 MB invoice": (big_valid, 202, ""),
    }


# --------------------------------------------------------------------------- 0. the checks' cost


def checks_cost(rounds: int = 15, number: int = 1000) -> tuple[float, float, float]:
    """Median microseconds per parse of the Order example without and with the intake limit checks
    (interleaved rounds), and of the checks alone on its decoded text (steadier on a busy machine: the
    difference of two parses drowns in their noise)."""
    check = intake_parse._check_markup
    text = ORDER.decode("utf-8")
    with_, without, alone = [], [], []
    for _ in range(rounds):
        intake_parse._check_markup = lambda text, limits: 0  # type: ignore[assignment]
        without.append(min(timeit.repeat(lambda: xmlintake.parse_document_text(ORDER), number=number, repeat=3)))
        intake_parse._check_markup = check  # type: ignore[assignment]
        with_.append(min(timeit.repeat(lambda: xmlintake.parse_document_text(ORDER), number=number, repeat=3)))
        alone.append(min(timeit.repeat(lambda: check(text, xmlintake.DEFAULT_LIMITS), number=5 * number, repeat=3)) / 5)
    return tuple(statistics.median(v) / number * 1e6 for v in (without, with_, alone))  # type: ignore[return-value]


# --------------------------------------------------------------------------- clients


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(pct / 100 * (len(ordered) - 1))))]


async def _honest(port: int, seconds: float, clients: int, rate: float, tag: str) -> dict[str, object]:
    latencies: list[float] = []
    errors: list[str] = []
    think = clients / rate
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def one(n: int) -> None:
        conn = Connection("127.0.0.1", port)
        await asyncio.sleep(n * think / clients)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    status, _ = await conn.post("/v1/documents", ACME, order_with_id(f"{tag}-{next(counter)}"))
                except (OSError, asyncio.IncompleteReadError) as exc:
                    errors.append(type(exc).__name__)
                    await conn.close()
                    continue
                elapsed = time.perf_counter() - started
                if status == 200:
                    latencies.append(elapsed)
                else:
                    errors.append(str(status))
                await asyncio.sleep(max(0.0, think - elapsed))
        finally:
            await conn.close()

    await asyncio.gather(*[one(n) for n in range(clients)])
    return {
        "count": len(latencies),
        "errors": errors,
        "p50": _percentile(latencies, 50) * 1e3,
        "p99": _percentile(latencies, 99) * 1e3,
    }


def honest_process(port: int, seconds: float, clients: int, rate: float, tag: str, out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(_honest(port, seconds, clients, rate, tag)))


async def post_watching(port: int, headers: dict[str, str], body: bytes, local: str | None = None) -> tuple[int, str]:
    """POST on a fresh connection, watching for an early answer while the body goes out (RFC 9112, section
    9.6: a client sending a body monitors the connection for an error response and stops sending); returns
    the status and the problem code (0 and the exception's name when no answer could be read)."""
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=(local, 0) if local is not None else None
        )
    except OSError as exc:
        return 0, type(exc).__name__
    try:
        head = f"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
        writer.write(head.encode("latin-1"))
        for start in range(0, len(body), 65536):
            if answer.done():
                break  # answered early: stop sending
            writer.write(body[start : start + 65536])
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                break
        raw = await answer
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = next(
            (
                int(v)
                for n, _, v in (line.partition(":") for line in lines[1:])
                if n.strip().lower() == "content-length"
            ),
            0,
        )
        data = await reader.readexactly(length) if length else b""
        code = ""
        if status >= 400:
            match = re.search(rb'"code":"([a-z-]+)"', data)
            code = match.group(1).decode() if match else ""
        return status, code
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        return 0, type(exc).__name__
    finally:
        writer.close()


#: the hostile documents, made before the client processes fork (they inherit them rather than rebuild them)
_DOCUMENTS: dict[str, tuple[bytes, int, str]] = {}


async def _hostile(port: int, seconds: float, clients: int) -> dict[str, list[tuple[float, int, str]]]:
    documents = _DOCUMENTS
    names = list(documents)
    answers: dict[str, list[tuple[float, int, str]]] = {name: [] for name in names}
    deadline = time.perf_counter() + seconds

    async def one(n: int) -> None:
        i = n
        while time.perf_counter() < deadline:
            name = names[i % len(names)]
            i += 1
            started = time.perf_counter()
            status, code = await post_watching(port, GLOBEX, documents[name][0])
            answers[name].append((time.perf_counter() - started, status, code))

    await asyncio.gather(*[one(n) for n in range(clients)])
    return answers


def hostile_process(port: int, seconds: float, clients: int, out: multiprocessing.Queue) -> None:
    t0 = time.process_time()
    answers = asyncio.run(_hostile(port, seconds, clients))
    answers["__cpu__"] = time.process_time() - t0  # type: ignore[assignment]
    out.put(answers)


class HealthProbe(threading.Thread):
    """``GET /healthz`` every 100 ms; keeps the slowest answer (a failure counts as infinitely slow)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stop = threading.Event()
        self.times: list[float] = []

    def run(self) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.times.append(time.perf_counter() - started if ok else float("inf"))
                self.stop.wait(0.1)

    def slowest_ms(self) -> float:
        return max(self.times) * 1e3 if self.times else float("nan")


_SLOW = re.compile(r"slow commit: a transaction of \d+ operations took (\d+) ms")


def slow_commits(log: Path, start: int) -> list[int]:
    text = log.read_text(errors="replace")[start:]
    return [int(m) for m in _SLOW.findall(text)]


def commits_line(slow: list[int]) -> str:
    """The store's slow commits: the disk's syncs, which no CPU priority changes, show in either phase's tail."""
    return f"store commits over 100 ms: {len(slow)}{f' (slowest {max(slow)} ms)' if slow else ''}"


# --------------------------------------------------------------------------- 4. floods of wrong keys

#: a partner whose scrypt-hashed key no request uses: its id is public, its checks can never be migrated
UNUSED_KEY_ID = "unused-demo"
FLOODS = ("known-id-one-address", "known-id-many-addresses", "unused-scrypt-key-many-addresses")


async def _flood(port: int, seconds: float, clients: int, flood: str) -> dict[str, object]:
    import secrets

    key_id = UNUSED_KEY_ID if flood.startswith("unused") else "acme-demo"
    spread = flood.endswith("many-addresses")
    statuses: dict[str, int] = {}
    deadline = time.perf_counter() + seconds
    counter = iter(range(10**9))

    async def one() -> None:
        while time.perf_counter() < deadline:
            n = next(counter)
            local = f"127.{1 + n // 60000 % 200}.{n // 250 % 240}.{1 + n % 250}" if spread else None
            headers = {
                "Authorization": f"Bearer {key_id}.{secrets.token_urlsafe(32)}",
                "Content-Type": "application/xml",
            }
            status, code = await post_watching(port, headers, INVOICE, local)
            key = f"{status} {code}".strip()
            statuses[key] = statuses.get(key, 0) + 1

    await asyncio.gather(*[one() for _ in range(clients)])
    return {"statuses": statuses}


def flood_process(port: int, seconds: float, clients: int, flood: str, out: multiprocessing.Queue) -> None:
    out.put(asyncio.run(_flood(port, seconds, clients, flood)))


def run_floods(
    args: argparse.Namespace, port: int, server: ServerProcess, quiet: dict[str, object], queue: multiprocessing.Queue
) -> dict[str, bool]:
    goals: dict[str, bool] = {}
    print(
        f"4. floods of wrong keys ({args.flooders} clients, {args.flood_seconds:g} s each) with {args.honest} "
        f"honest clients:",
        flush=True,
    )
    for flood in FLOODS:
        cpu0, wall0 = server.cpu_seconds(), time.monotonic()
        flooder = multiprocessing.Process(
            target=flood_process, args=(port, args.flood_seconds, args.flooders, flood, queue)
        )
        honest = multiprocessing.Process(
            target=honest_process, args=(port, args.flood_seconds - 1, args.honest, args.rate, f"flood-{flood}", queue)
        )
        flooder.start()
        time.sleep(1)  # the flood first: the honest clients meet it from their first request
        honest.start()
        results = [queue.get(), queue.get()]
        flooder.join()
        honest.join()
        wall = time.monotonic() - wall0
        loaded = next(r for r in results if "p99" in r)
        statuses = next(r for r in results if "statuses" in r)["statuses"]
        refused = sum(statuses.values())
        cpu = server.cpu_seconds() - cpu0
        print(
            f"   {flood:34s} {refused:6d} refused ({', '.join(f'{k}: {v}' for k, v in sorted(statuses.items()))}); "
            f"server CPU {cpu / wall:.0%} of one core, {1e3 * cpu / max(1, refused + int(loaded['count'])):.2f} "
            f"ms per request; honest {loaded['count']} round trips, p50 {loaded['p50']:.1f} ms, p99 "
            f"{loaded['p99']:.1f} ms ({loaded['p99'] / quiet['p99']:.1f}x quiet), errors {len(loaded['errors'])} "
            f"{sorted(set(loaded['errors']))[:5]}",
            flush=True,
        )
        goals[f"{flood}: honest p99 within 3x quiet"] = loaded["p99"] <= 3 * quiet["p99"]
        goals[f"{flood}: every honest request answered"] = not loaded["errors"]
    return goals


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20, help="length of phases 1 and 3")
    parser.add_argument(
        "--warm-up", type=float, default=10, help="seconds of the honest load before phase 1, not measured"
    )
    parser.add_argument("--honest", type=int, default=16, help="honest clients")
    parser.add_argument("--hostile", type=int, default=16, help="hostile clients")
    parser.add_argument("--rate", type=float, default=40, help="honest requests per second, all clients together")
    parser.add_argument(
        "--classes", default="", help="only the hostile classes whose names hold one of these words (comma-separated)"
    )
    parser.add_argument(
        "--hostile-limits",
        default="concurrent_requests=2,requests_per_second=20",
        help="the hostile partner's limits in partners.yaml (key=value,...), as an operator sets them "
        "for a partner; the honest partner keeps the defaults",
    )
    parser.add_argument(
        "--store-dir",
        default=None,
        help="the folder of the fresh SQLite store (default: the "
        "temporary folder); /dev/shm keeps the disk's syncs out of "
        "the figures",
    )
    parser.add_argument(
        "--stomp-flood",
        action="store_true",
        help="phase 4: the honest clients while the STOMP listener is flooded (bench/stomp_flood.py)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting over the sample configuration's, by its dotted path (repeatable), such as "
        "server.intake_workers=1 or store.options.sqlite_synchronous=NORMAL",
    )
    parser.add_argument("--flood-seconds", type=float, default=15, help="length of each flood of phase 4")
    parser.add_argument("--flooders", type=int, default=32, help="clients of each flood of phase 4")
    parser.add_argument("--floods-only", action="store_true", help="phases 1 and 4 only")
    args = parser.parse_args()

    without, with_, alone = checks_cost()
    print(
        f"0. parse of the 14 KB Order example: {without:.1f} us without the limit checks, {with_:.1f} us with "
        f"them ({with_ - without:+.1f} us, {100 * (with_ - without) / without:+.1f}%); the checks alone "
        f"{alone:.2f} us ({100 * alone / without:.1f}% of the parse)",
        flush=True,
    )

    documents = hostile_documents()
    if args.classes:
        documents = {k: v for k, v in documents.items() if any(w in k for w in args.classes.split(","))}
    _DOCUMENTS.update(documents)
    with tempfile.TemporaryDirectory(prefix="hostile-bench-") as tmp:
        folder = Path(tmp)
        config = sample_config()
        store = Path(tempfile.mkdtemp(prefix="hostile-bench-", dir=args.store_dir)) if args.store_dir else folder
        config["store"]["url"] = f"sqlite:///{store / 'bench.db'}"
        config["store"].setdefault("options", {})["slow_commit_warning"] = 0.1
        partners = yaml.safe_load((REPO / "config" / "partners.yaml").read_text())
        limits = dict(item.split("=", 1) for item in args.hostile_limits.split(",") if item)
        partners["partners"]["globex"]["limits"] = {k: float(v) if "." in v else int(v) for k, v in limits.items()}
        from gateway.routing.partners import generate_key, hash_key

        partners["partners"]["unused"] = {
            "keys": [{"id": UNUSED_KEY_ID, "hash": hash_key(generate_key(UNUSED_KEY_ID))}]
        }
        (folder / "partners.yaml").write_text(yaml.safe_dump(partners, sort_keys=False))
        config["partners"] = "partners.yaml"
        config["routes"] = str(REPO / "routes" / "ubl-2.1.yaml")
        config["etl"] = {"enabled": False}
        flood_passcode = uuid.uuid4().hex
        config["stomp"]["port"] = stomp_port = free_port()
        config["stomp"]["users"]["backend"]["passcode_file"] = str(folder / "backend.passcode")
        config["stomp"]["users"][stomp_flood.FLOODER] = {
            "passcode_hash": hash_passcode(flood_passcode),
            "send": ["/queue/flood.>"],
        }
        for item in args.set:
            path, _, value = item.partition("=")
            *parents, key = path.split(".")
            place = config
            for name in parents:
                place = place.setdefault(name, {})
            place[key] = yaml.safe_load(value)
        path = folder / "bench.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        log = folder / "server.log"
        server = ServerProcess(path, port, log)
        try:
            server.wait_ready()
            # the first invalid document starts the error-report helper, which builds its schemas meanwhile
            warm_up = INVOICE.replace(b"<cbc:IssueDate>2009-12-15", b"<cbc:IssueDate>warm-up")
            httpx.post(f"http://127.0.0.1:{port}/v1/documents", content=warm_up, headers=GLOBEX, timeout=30)
            time.sleep(5)
            queue: multiprocessing.Queue = multiprocessing.Queue()
            if args.warm_up > 0:  # a new server's first seconds are slower: the quiet phase is its steady state
                worker = multiprocessing.Process(
                    target=honest_process, args=(port, args.warm_up, args.honest, args.rate, "warm", queue)
                )
                worker.start()
                queue.get()
                worker.join()

            log_mark = len(log.read_text(errors="replace"))
            probe = HealthProbe(port)
            probe.start()
            worker = multiprocessing.Process(
                target=honest_process, args=(port, args.seconds, args.honest, args.rate, "quiet", queue)
            )
            worker.start()
            quiet = queue.get()
            worker.join()
            probe.stop.set()
            probe.join()
            print(
                f"1. {args.honest} honest clients alone ({args.rate:g} orders/s): {quiet['count']} round trips, "
                f"p50 {quiet['p50']:.1f} ms, p99 {quiet['p99']:.1f} ms, errors {len(quiet['errors'])}; "
                f"slowest /healthz {probe.slowest_ms():.1f} ms; {commits_line(slow_commits(log, log_mark))}",
                flush=True,
            )

            if args.floods_only:
                goals = run_floods(args, port, server, quiet, queue)
                print("goals: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in goals.items()), flush=True)
                return
            print("2. each hostile class alone:", flush=True)
            alone_ok = True
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                for name, (body, status, code) in documents.items():
                    started = time.perf_counter()
                    response = client.post("/v1/documents", content=body, headers=GLOBEX)
                    took = time.perf_counter() - started
                    got = response.json().get("code", "") if response.status_code >= 400 else ""
                    ok = response.status_code == status and got == code and took <= BUDGET
                    alone_ok &= ok
                    print(
                        f"   {name:48s} {len(body) / 1e6:5.1f} MB  {took * 1e3:7.0f} ms  {response.status_code} "
                        f"{got:30s} {'ok' if ok else 'MISSED'}",
                        flush=True,
                    )

            log_mark = len(log.read_text(errors="replace"))
            cpu0, loop0, helpers0, wall0 = (
                server.cpu_seconds(),
                server.loop_cpu_seconds(),
                server.helper_cpu_seconds(),
                time.monotonic(),
            )
            probe = HealthProbe(port)
            probe.start()
            honest = multiprocessing.Process(
                target=honest_process, args=(port, args.seconds, args.honest, args.rate, "loaded", queue)
            )
            hostile = multiprocessing.Process(target=hostile_process, args=(port, args.seconds, args.hostile, queue))
            hostile.start()
            time.sleep(1)  # the hostile load first, so that the honest clients meet it from their first request
            honest.start()
            results = [queue.get(), queue.get()]
            honest.join()
            hostile.join()
            probe.stop.set()
            probe.join()
            loaded = next(r for r in results if "p99" in r)
            answers = next(r for r in results if "p99" not in r)
            print(
                f"3. {args.honest} honest clients with {args.hostile} hostile ones (their partner's limits: "
                f"{args.hostile_limits or 'the defaults'}): {loaded['count']} round trips, "
                f"p50 {loaded['p50']:.1f} ms, p99 {loaded['p99']:.1f} ms ({loaded['p99'] / quiet['p99']:.1f}x "
                f"quiet), errors {len(loaded['errors'])} {sorted(set(loaded['errors']))[:5]}",
                flush=True,
            )
            hostile_ok = True
            client_cpu = answers.pop("__cpu__")
            for name, got in answers.items():
                if not got:
                    continue
                times = [t for t, _, _ in got]
                status, code = documents[name][1], documents[name][2]
                codes = sorted({f"{s} {c}".strip() for _, s, c in got})
                ok = max(times) <= BUDGET and all(s == status and c == code or s == 429 for _, s, c in got)
                hostile_ok &= ok
                print(
                    f"   {name:48s} {len(got):4d} sent, slowest {max(times) * 1e3:6.0f} ms, p50 "
                    f"{statistics.median(times) * 1e3:6.0f} ms  {', '.join(codes)[:60]:60s} {'ok' if ok else 'MISSED'}",
                    flush=True,
                )
            wall = time.monotonic() - wall0
            print(
                f"   the server's CPU meanwhile: {(server.cpu_seconds() - cpu0) / wall:.0%} of one core "
                f"({(server.loop_cpu_seconds() - loop0) / wall:.0%} in its event loop, "
                f"{(server.helper_cpu_seconds() - helpers0) / wall:.0%} in its helper processes); load average "
                f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; the hostile clients' own CPU "
                f"{client_cpu / wall:.0%} of one core",
                flush=True,
            )
            print(
                f"   slowest /healthz {probe.slowest_ms():.1f} ms; {commits_line(slow_commits(log, log_mark))}",
                flush=True,
            )
            goals = {
                "every hostile answer within 2 s with its code": alone_ok and hostile_ok,
                "honest clients: no error": not loaded["errors"],
                "honest p99 within 3x quiet": loaded["p99"] <= 3 * quiet["p99"],
                "/healthz within 100 ms": probe.slowest_ms() <= 100,
                **run_floods(args, port, server, quiet, queue),
            }
            if args.stomp_flood:
                goals.update(stomp_flood_phase(port, stomp_port, flood_passcode, args, quiet, queue))
            print("goals: " + "; ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in goals.items()), flush=True)
        finally:
            server.stop()
            if store != folder:
                shutil.rmtree(store, ignore_errors=True)


def stomp_flood_phase(
    port: int, stomp_port: int, passcode: str, args: argparse.Namespace, quiet: dict, queue: multiprocessing.Queue
) -> dict[str, bool]:
    """Phase 4: the honest clients while the STOMP listener is flooded; its goals."""
    probe = HealthProbe(port)
    probe.start()
    flood = multiprocessing.Process(
        target=stomp_flood.flood_process, args=(stomp_port, passcode, args.seconds + 2, queue)
    )
    flood.start()
    time.sleep(1)  # the flood first
    honest = multiprocessing.Process(
        target=honest_process, args=(port, args.seconds, args.honest, args.rate, "stomp", queue)
    )
    honest.start()
    results = [queue.get(), queue.get()]
    honest.join()
    flood.join()
    probe.stop.set()
    probe.join()
    loaded = next(r for r in results if "p99" in r)
    seen = next(r for r in results if "stomp" in r)["stomp"]
    print(
        f"4. {args.honest} honest clients while STOMP is flooded: {loaded['count']} round trips, "
        f"p50 {loaded['p50']:.1f} ms, p99 {loaded['p99']:.1f} ms ({loaded['p99'] / quiet['p99']:.1f}x quiet), "
        f"errors {len(loaded['errors'])} {sorted(set(loaded['errors']))[:5]}; slowest /healthz "
        f"{probe.slowest_ms():.1f} ms",
        flush=True,
    )
    print(
        f"   the flood sent {seen['sent_mb']:.0f} MB after CONNECT; ERROR frames it got: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(seen["errors"].items())),
        flush=True,
    )
    return {
        "STOMP flood: honest clients without error": not loaded["errors"],
        "STOMP flood: honest p99 within 3x quiet": loaded["p99"] <= 3 * quiet["p99"],
    }


if __name__ == "__main__":
    main()
