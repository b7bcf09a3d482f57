"""Benchmark of the HTTP gateway, driven over loopback. Prints, in one run:

1. lxml's parse + validate rate alone (the UBL Order example, this process, one thread), 5 s
   before the server starts and 5 s again after (3), with the server idle; the ceiling takes
   their mean. This machine's speed drifts by 10-20% within minutes (it shares its host), and
   a single figure taken before could be from a faster or slower spell than (3)'s;
2. the server's rate on a no-op endpoint (``POST /v1/noop``: reads the same body, answers 202);
3. accepted UBL Orders per second on a one-way route (HTTP, auth, parse, validate, route,
   durable store on SQLite with the ledger row in the same commit), each order with a
   fresh ``cbc:ID`` so none is an idempotent replay;

(2) and (3) are closed loops of ``--connections`` keep-alive clients, 100 by default: the
issue's client count (as in 4), and enough to keep the server busy. Each order is answered
only once its commit is durable, so with fewer clients the rate is bounded by how many
are in flight per commit rather than by the server's work: 32 clients left a fifth of the
CPU idle, waiting for commits, and measured 20-25% fewer orders per second;
4. request-reply round trips through the sample order responder (in-process worker) with
   100 concurrent clients: p50 / p99 latency, paced (each client sends, waits for its
   reply, then thinks), and closed-loop (no think time) for the saturation figures, with the
   server's CPU per round trip (all its processes: serving, responder threads, rules workers;
   the rules workers' share apart). The paced
   phase also lists the store commits the server logged as slower than 20 ms meanwhile (its
   ``slow_commit_warning``): one such commit, nearly always the disk's sync, holds up every
   round trip waiting on it, so a p99 over the goal says whether the disk was the cause.

Goals: (3) >= 75% of the ceiling 1 / (1/(2) + 1/(1)); p99 of (4, paced) <= 20 ms.

Usage::

    .venv/bin/python bench/gateway_bench.py [--seconds 10] [--connections 100] [--rate 50] [--keep] [--processes N]

The server is ``b2bgw serve`` in a subprocess (one uvicorn process, uvloop + httptools; with
``--processes N`` a supervisor and N serving processes on one port, each bound to one CPU, their
CPU time summed
when installed) on a fresh SQLite store (``synchronous=FULL``) in a temporary folder.
Load comes from ``wrk`` when it is installed (``apt-get install wrk``) for (2) and (3),
else from an asyncio client that speaks HTTP/1.1 by hand over keep-alive connections
(one per client); (4) always uses that asyncio client (it paces and times each request). Everything talks to 127.0.0.1 only and stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.intake.schemas import SchemaRegistry  # noqa: E402
from gateway.intake.xmlsafe import parse_document  # noqa: E402
from gateway.routing.partners import generate_key, hash_key  # noqa: E402

ORDER_FILE = REPO.parent / "shared" / "ubl-2.1" / "xml" / "UBL-Order-2.1-Example.xml"
ORDER = ORDER_FILE.read_bytes()
ID_TAG = b"<cbc:ID>34</cbc:ID>"
HEAD, TAIL = ORDER.split(ID_TAG, 1)
ACME_KEY = "acme-demo.EOSR0zYti7vSYAzgLvqVss8uQCIXEmWO3fDuUsmKiIA"


def order_with_id(order_id: str) -> bytes:
    return HEAD + b"<cbc:ID>" + order_id.encode() + b"</cbc:ID>" + TAIL


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The server logs commits slower than this (ms): the latency goal's budget is 20 ms for a whole round trip.
SLOW_COMMIT_MS = 20
_SLOW_COMMIT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) WARNING .*slow commit: .*? took (\d+) ms")


def slow_commits(log: Path, start: float, end: float) -> list[float]:
    """The durations (ms) of the slow commits the server logged between *start* and *end* (epoch s)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        match = _SLOW_COMMIT.match(line)
        if match:
            when = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if start <= when <= end + 0.5:  # logged when the commit ended
                found.append(float(match[2]))
    return found


def sample_config() -> dict:
    """The sample configuration, for a copy written elsewhere: its rule files' paths made absolute (they are
    relative to the sample's folder, which the copy is not in)."""
    config = yaml.safe_load((REPO / "config" / "b2bgw.yaml").read_text())
    for entry in config.get("rules", {}).get("sets", {}).values():
        entry["file"] = str((REPO / "config" / entry["file"]).resolve())
    return config


def write_config(
    folder: Path, bench_key: str, synchronous: str = "FULL", responders: int | None = None, rules: bool = True
) -> Path:
    config = sample_config()
    partners = yaml.safe_load((REPO / "config" / "partners.yaml").read_text())["partners"]
    routes = yaml.safe_load((REPO / "routes" / "ubl-2.1.yaml").read_text())["routes"]
    # the benchmark's client is a high-volume partner: its limits are raised as an operator would raise them
    partners["bench"] = {
        "name": "Benchmark client",
        "keys": [{"id": "bench", "hash": hash_key(bench_key, ln=10)}],
        "limits": {"concurrent_requests": 4096, "requests_per_second": 1_000_000},
    }
    partners["acme"]["limits"] = dict(partners["bench"]["limits"])  # the request-reply phase's clients
    order_route = next(r for r in routes if r["id"] == "ubl-order")
    routes.append(
        {
            "id": "bench-order-one-way",
            "partners": ["bench"],
            "root": order_route["root"],
            "schema": order_route["schema"],
            "properties": order_route["properties"],
            "destination": "queue://orders.bench",
            "delivery_mode": "persistent",
        }
    )
    config["store"]["url"] = f"sqlite:///{folder / 'bench.db'}"
    config["store"].setdefault("options", {})["sqlite_synchronous"] = synchronous
    # every commit over SLOW_COMMIT_MS is logged: (4) reports those that happened during its phase
    config["store"]["options"]["slow_commit_warning"] = SLOW_COMMIT_MS / 1000
    if os.environ.get("BENCH_INTAKE_THREADS"):  # A/B runs: the gateway's intake threads (0: on the event loop)
        config.setdefault("server", {})["intake_threads"] = int(os.environ["BENCH_INTAKE_THREADS"])
    if os.environ.get("BENCH_INTAKE_FACTS"):  # A/B runs: server.intake_facts (always, when_idle, never)
        config.setdefault("server", {})["intake_facts"] = os.environ["BENCH_INTAKE_FACTS"]
    if os.environ.get("BENCH_STORE_OPTIONS"):  # A/B runs: any Broker.open options, as JSON
        config["store"]["options"].update(json.loads(os.environ["BENCH_STORE_OPTIONS"]))
    if os.environ.get("BENCH_PREFETCH"):
        config["store"]["options"]["prefetch"] = int(os.environ["BENCH_PREFETCH"])
    if not rules:  # the request-reply phase without the sample Order route's business rules
        config.pop("rules", None)
        for route in routes:
            route.pop("rules", None)
    config["partners"] = partners
    config["routes"] = routes
    config["etl"] = {"enabled": False}
    if responders is not None:
        config["workers"] = [{"module": "gateway.samples.order_responder", "concurrency": responders}]
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ServerProcess:
    def __init__(
        self, config: Path, port: int, log: Path, processes: int = 1, tls: ssl.SSLContext | None = None
    ) -> None:
        self.port = port
        self.log = log
        self.tls = tls
        env = {**os.environ, "B2BGW_NOOP_ENDPOINT": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "--log-level",
                "WARNING",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
                "--no-access-log",
                "--no-etl",
                "--processes",
                str(processes),
            ],
            cwd=str(config.parent),
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: see {self.log}")
            try:
                scheme = "https" if self.tls is not None else "http"
                if (
                    httpx.get(
                        f"{scheme}://127.0.0.1:{self.port}/readyz",
                        timeout=1,
                        verify=self.tls if self.tls is not None else True,
                    ).status_code
                    == 200
                ):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError("the server did not become ready")

    def pids(self) -> list[int]:
        """The server's process and its descendants: its serving processes (``--processes`` > 1) and the
        helper processes they start (error reports, business rules, large documents' intake)."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        found, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo.extend(child for child, parent in parents.items() if parent == pid)
        return found

    @staticmethod
    def is_helper(pid: int) -> bool:
        """Whether *pid* is a helper process (``python -m gateway.<module>``) rather than a serving one."""
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return b"-m\0gateway." in command and b"-m\0gateway.cli." not in command  # serving: gateway.cli.main

    @staticmethod
    def _cpu(stat: Path) -> float:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the server's processes have used so far."""
        return sum(self._cpu(Path(f"/proc/{pid}/stat")) for pid in self.pids())

    def loop_cpu_seconds(self) -> float:
        """CPU time of the server's event loops (the main threads of its serving processes) so far."""
        return sum(self._cpu(Path(f"/proc/{pid}/task/{pid}/stat")) for pid in self.pids() if not self.is_helper(pid))

    def helper_cpu_seconds(self) -> float:
        """CPU time of the server's helper processes so far (those running now)."""
        return sum(self._cpu(Path(f"/proc/{pid}/stat")) for pid in self.pids() if self.is_helper(pid))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# --------------------------------------------------------------------------- 1. lxml alone


def validate_rate(seconds: float) -> float:
    registry = SchemaRegistry.ubl21(["Order"])
    registry.compile(details=False)
    for _ in range(200):
        registry.is_valid(parse_document(ORDER), "ubl-2.1/Order")
    count = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            root = parse_document(ORDER)
            assert registry.is_valid(root, "ubl-2.1/Order")
        count += 50
    return count / (time.perf_counter() - started)


# --------------------------------------------------------------------------- load: wrk


def lua_long(data: bytes) -> str:
    text = data.decode("utf-8")
    level = "=" * 4
    assert f"]{level}]" not in text
    return f"[{level}[{text}]{level}]"


def wrk_script(path: Path, headers: dict[str, str], *, unique: bool, body: bytes = ORDER) -> Path:
    header_lines = "\n".join(f'headers["{k}"] = "{v}"' for k, v in headers.items())
    if unique:
        head, tail = body.split(ID_TAG, 1)
        script = f"""
local counter = 0
local threads = 0
headers = {{}}
{header_lines}
local head = {lua_long(head)}
local tail = {lua_long(tail)}
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
request = function()
  counter = counter + 1
  local id = "<cbc:ID>" .. prefix .. "-" .. tid .. "-" .. counter .. "</cbc:ID>"
  return wrk.format("POST", "/v1/documents", headers, head .. id .. tail)
end
function init(args)
  prefix = args[1]
end
"""
    else:
        script = f"""
headers = {{}}
{header_lines}
local body = {lua_long(body)}
request = function()
  return wrk.format("POST", path_, headers, body)
end
function init(args)
  path_ = args[1]
end
"""
    path.write_text(script)
    return path


def run_wrk(url: str, script: Path, seconds: float, connections: int, args: list[str]) -> dict[str, float]:
    cmd = [
        "wrk",
        "-t",
        "1",
        "-c",
        str(connections),
        "-d",
        f"{seconds:g}s",
        "--latency",
        "-s",
        str(script),
        url,
        "--",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60).stdout
    total = int(re.search(r"(\d+) requests in ([\d.]+)(\w+)", out).group(1))
    span = re.search(r"requests in ([\d.]+)(ms|s|m)", out)
    duration = float(span.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[span.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"\s{pct}(?:\.000)?%\s+([\d.]+)(us|ms|s)", out)
        if m:
            lat[pct] = float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]
    bad = int(non2xx.group(1)) if non2xx else 0
    return {
        "total": total,
        "ok": total - bad,
        "bad": bad,
        "seconds": duration,
        "rate": (total - bad) / duration,
        "p50_ms": lat.get("50", float("nan")),
        "p99_ms": lat.get("99", float("nan")),
        "socket_errors": errors.group(1) if errors else "",
    }


# --------------------------------------------------------------------------- load: asyncio, raw HTTP/1.1


class Connection:
    """One keep-alive HTTP/1.1 connection, written and read by hand: the asyncio client must cost the
    server's two CPUs as little as possible (httpx's pool alone caps 100 concurrent clients near 70 req/s)."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        self.host, self.port = host, port
        self.tls = tls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.used = 0.0

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        try:
            return await self._post(path, headers, body)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise
            await self.close()  # the server closed an idle connection before reading the request: send again
            return await self._post(path, headers, body)

    async def _post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if self.writer is not None and time.monotonic() - self.used > 3.0:  # uvicorn closes idle ones after 5 s
            await self.close()
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, ssl=self.tls)
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        self.writer.write(head.encode("latin-1") + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        self.used = time.monotonic()
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
        self.reader = self.writer = None


async def closed_loop(
    url: str,
    headers: dict[str, str],
    seconds: float,
    concurrency: int,
    body_for,
    expect: int,
    tls: ssl.SSLContext | None = None,
) -> dict[str, float]:
    """``concurrency`` clients, each on its own connection, sending back to back."""
    host, port, path = _split(url)
    latencies: list[float] = []
    bad = 0
    counter = iter(range(10**9))
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal bad
        conn = Connection(host, port, tls)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status, _ = await conn.post(path, headers, body_for(next(counter)))
                if status == expect:
                    latencies.append(time.perf_counter() - started)
                else:
                    bad += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return summary(latencies, bad, time.perf_counter() - started)


async def paced(
    url: str,
    headers: dict[str, str],
    seconds: float,
    clients: int,
    rate: float,
    body_for,
    expect: int,
    tls: ssl.SSLContext | None = None,
) -> dict[str, float]:
    """``clients`` concurrent clients, each on its own connection: send, wait for the reply, think (exponential,
    so that all together offer ``rate`` requests/s); latency is send to reply."""
    host, port, path = _split(url)
    latencies: list[float] = []
    bad = 0
    think = clients / rate  # mean seconds between one client's requests
    counter = iter(range(10**9))
    deadline = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal bad
        conn = Connection(host, port, tls)
        try:
            await asyncio.sleep(random.uniform(0, think))
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status, _ = await conn.post(path, headers, body_for(next(counter)))
                elapsed = time.perf_counter() - started
                if status == expect:
                    latencies.append(elapsed)
                else:
                    bad += 1
                pause = max(0.0, random.expovariate(1 / think) - elapsed)
                if time.perf_counter() + pause >= deadline:  # its next request would start after the phase
                    break
                await asyncio.sleep(pause)
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*[one() for _ in range(clients)])
    return summary(latencies, bad, time.perf_counter() - started)


def _split(url: str) -> tuple[str, int, str]:
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    return host, int(port), "/" + path


def summary(latencies: list[float], bad: int, elapsed: float) -> dict[str, float]:
    latencies.sort()

    def pct(p: float) -> float:
        if not latencies:
            return float("nan")
        return latencies[min(len(latencies) - 1, int(round(p / 100 * (len(latencies) - 1))))] * 1000

    return {
        "total": len(latencies) + bad,
        "ok": len(latencies),
        "bad": bad,
        "seconds": elapsed,
        "rate": len(latencies) / elapsed,
        "p50_ms": pct(50),
        "p99_ms": pct(99),
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
    }


# --------------------------------------------------------------------------- main


def report_throughput(folder: Path, results: dict, cpu: dict[str, float]) -> None:
    """Print phases 1-3 and check that every 202 is one message and one ledger row."""
    import sqlalchemy as sa

    from broker_core import Broker, Queue

    broker = Broker.open(f"sqlite:///{folder / 'bench.db'}", sweep_interval=0)
    try:
        queued = broker.stats(Queue("orders.bench")).depth
        with broker.engine.connect() as conn:
            rows, with_facts = conn.execute(
                sa.text("SELECT count(*), count(facts) FROM b2b_ledger WHERE route = 'bench-order-one-way'")
            ).one()
    finally:
        broker.close()
    validate = results["validate"]
    noop = results["noop"]["rate"]
    accepted = results["accepted"]
    ceiling = 1 / (1 / noop + 1 / validate)
    ratio = accepted["rate"] / ceiling
    print(
        f"lxml parse+validate alone     {validate:9.0f} documents/s (before {results['validate_before']:.0f}, "
        f"after {results['validate_after']:.0f})"
    )
    print(f"no-op endpoint                {noop:9.0f} requests/s")
    print(f"ceiling 1/(1/noop+1/validate) {ceiling:9.0f} requests/s")
    print(
        f"one-way Orders accepted       {accepted['rate']:9.0f} orders/s = {ratio:.0%} of the ceiling "
        f"(goal >= 75%: {'met' if ratio >= 0.75 else 'NOT met'}); p50 {accepted['p50_ms']:.1f} ms, "
        f"p99 {accepted['p99_ms']:.1f} ms; {accepted['bad']:.0f} refused"
    )
    print(
        f"   stored: {queued} messages in queue://orders.bench, {rows} ledger rows "
        f"(50 warm-up + {accepted['ok']:.0f} accepted in the phase); {with_facts} with their warehouse facts "
        f"extracted at intake, the others' left to the nightly load (server.intake_facts)"
    )
    print(
        f"server CPU (user+system, all its threads): {cpu['noop'] * 1e6:.0f} us per no-op request, "
        f"{cpu['accepted'] * 1e6:.0f} us per accepted order, of which {cpu['accepted_loop'] * 1e6:.0f} us in the "
        f"event loops' threads"
    )


def finish_one_way(args: argparse.Namespace, folder: Path, results: dict, cpu: dict[str, float]) -> int:
    """Phases 1-3's report alone (``--only-one-way``)."""
    print()
    report_throughput(folder, results, cpu)
    print(f"load average after: {os.getloadavg()[0]:.2f} (other processes share these {os.cpu_count()} CPUs)")
    print(json.dumps({**results, "server_cpu_per_request_s": cpu}, default=float))
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each load phase")
    parser.add_argument(
        "--connections",
        type=int,
        default=100,
        help="concurrent clients (keep-alive connections) of the throughput phases (2, 3)",
    )
    parser.add_argument("--clients", type=int, default=100, help="concurrent request-reply clients")
    parser.add_argument(
        "--rate",
        type=float,
        default=50.0,
        help="paced request-reply requests/s from all clients together (default 50: each client "
        "sends one every 2 s on average)",
    )
    parser.add_argument(
        "--sqlite-synchronous",
        default="FULL",
        choices=["FULL", "NORMAL"],
        help="the store's SQLite synchronous mode (FULL: the default, fsync per commit)",
    )
    parser.add_argument(
        "--responders", type=int, help="sessions of the sample order responder (default: as configured)"
    )
    parser.add_argument("--only-request-reply", action="store_true", help="run phase 4 only")
    parser.add_argument("--only-one-way", action="store_true", help="run phases 1-3 only (no request-reply)")
    parser.add_argument(
        "--no-rules",
        action="store_true",
        help="leave the sample Order route's business rules out (phase 4 then measures the exchange "
        "alone, as before routes had rules)",
    )
    parser.add_argument("--no-wrk", action="store_true", help="use the asyncio client even if wrk is installed")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (store, logs)")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="serving processes (b2bgw serve --processes N; 0: one per CPU, each bound to its CPU)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="compare HTTPS (server.tls, keep-alive) with plain HTTP in one run: one-way rate, "
        "request-reply p99, and new TLS handshakes per second",
    )
    args = parser.parse_args()
    if args.tls:
        return tls_comparison(args)

    use_wrk = shutil.which("wrk") is not None and not args.no_wrk
    folder = Path(tempfile.mkdtemp(prefix="b2bgw-bench-"))
    bench_key = generate_key("bench")
    config = write_config(folder, bench_key, args.sqlite_synchronous, args.responders, rules=not args.no_rules)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    results: dict[str, dict[str, float] | float] = {}

    print(
        f"b2bgw gateway benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"load from {'wrk' if use_wrk else 'an asyncio client'} ({args.connections} connections), "
        f"{args.seconds:g} s per phase, "
        f"SQLite synchronous={args.sqlite_synchronous}, {args.processes or os.cpu_count()} serving process(es), "
        f"Order route business rules {'off' if args.no_rules else 'on'}; "
        f"load average before: {os.getloadavg()[0]:.2f}"
    )
    only_rr = args.only_request_reply
    if not only_rr:
        print(f"1. lxml parse + validate alone ({len(ORDER)} byte UBL Order) ...", flush=True)
        results["validate"] = validate_rate(min(args.seconds, 5.0))

    server = ServerProcess(config, port, folder / "server.log", args.processes)
    try:
        server.wait_ready()
        bench_headers = {"Authorization": f"Bearer {bench_key}", "Content-Type": "application/xml"}
        acme_headers = {"Authorization": f"Bearer {ACME_KEY}", "Content-Type": "application/xml"}
        # warm up: the key cache, the routes, the responder
        for i in range(50):
            httpx.post(f"{base}/v1/documents", content=order_with_id(f"warm-{i}"), headers=bench_headers, timeout=30)
            httpx.post(f"{base}/v1/documents", content=order_with_id(f"warm-rr-{i}"), headers=acme_headers, timeout=30)
        run = uuid.uuid4().hex[:8]

        cpu: dict[str, float] = {}
        if not only_rr:
            print("2. no-op endpoint ...", flush=True)
            before = server.cpu_seconds()
            if use_wrk:
                script = wrk_script(folder / "noop.lua", {"Content-Type": "application/xml"}, unique=False)
                results["noop"] = run_wrk(base, script, args.seconds, args.connections, ["/v1/noop"])
            else:
                results["noop"] = asyncio.run(
                    closed_loop(
                        f"{base}/v1/noop",
                        {"Content-Type": "application/xml"},
                        args.seconds,
                        args.connections,
                        lambda n: ORDER,
                        202,
                    )
                )

            cpu["noop"] = (server.cpu_seconds() - before) / max(1, results["noop"]["total"])
            print("3. one-way Orders accepted ...", flush=True)
            before = server.cpu_seconds()
            loop_before = server.loop_cpu_seconds()
            if use_wrk:
                script = wrk_script(folder / "oneway.lua", bench_headers, unique=True)
                results["accepted"] = run_wrk(base, script, args.seconds, args.connections, [f"ow{run}"])
            else:
                results["accepted"] = asyncio.run(
                    closed_loop(
                        f"{base}/v1/documents",
                        bench_headers,
                        args.seconds,
                        args.connections,
                        lambda n: order_with_id(f"ow{run}-{n}"),
                        202,
                    )
                )

            cpu["accepted"] = (server.cpu_seconds() - before) / max(1, results["accepted"]["total"])
            cpu["accepted_loop"] = (server.loop_cpu_seconds() - loop_before) / max(1, results["accepted"]["total"])
            print("   lxml parse + validate alone again ...", flush=True)
            time.sleep(1)  # the last commits' aftermath (a checkpoint) out of the way
            results["validate_before"] = results["validate"]
            results["validate_after"] = validate_rate(min(args.seconds, 5.0))
            results["validate"] = (results["validate_before"] + results["validate_after"]) / 2
        if args.only_one_way:
            return finish_one_way(args, folder, results, cpu)
        print(f"4. request-reply, {args.clients} clients paced at {args.rate:g} requests/s ...", flush=True)
        before = server.cpu_seconds()
        phase_start = time.time()
        results["rr_paced"] = asyncio.run(
            paced(
                f"{base}/v1/documents",
                acme_headers,
                args.seconds,
                args.clients,
                args.rate,
                lambda n: order_with_id(f"rp{run}-{n}"),
                200,
            )
        )
        cpu["rr_paced"] = (server.cpu_seconds() - before) / max(1, results["rr_paced"]["total"])
        time.sleep(0.2)  # the log's last lines written
        results["rr_paced"]["slow_commits_ms"] = slow_commits(server.log, phase_start, time.time())
        print("   ... and closed-loop (no think time) ...", flush=True)
        before = server.cpu_seconds()
        helper_before = server.helper_cpu_seconds()
        results["rr_closed"] = asyncio.run(
            closed_loop(
                f"{base}/v1/documents",
                acme_headers,
                args.seconds,
                args.clients,
                lambda n: order_with_id(f"rc{run}-{n}"),
                200,
            )
        )
        trips = max(1, results["rr_closed"]["total"])
        cpu["rr_closed"] = (server.cpu_seconds() - before) / trips
        cpu["rr_closed_helpers"] = (server.helper_cpu_seconds() - helper_before) / trips
    finally:
        server.stop()

    print()
    if not only_rr:
        report_throughput(folder, results, cpu)
    paced_rr = results["rr_paced"]
    closed_rr = results["rr_closed"]
    print(
        f"request-reply, {args.clients} clients paced ({paced_rr['rate']:.0f}/s): p50 {paced_rr['p50_ms']:.1f} ms, "
        f"p99 {paced_rr['p99_ms']:.1f} ms (goal <= 20 ms: {'met' if paced_rr['p99_ms'] <= 20 else 'NOT met'}); "
        f"{paced_rr['bad']:.0f} failed; server CPU {cpu['rr_paced'] * 1e3:.1f} ms per round trip"
    )
    slow = paced_rr["slow_commits_ms"]
    print(
        f"   store commits over {SLOW_COMMIT_MS} ms during that phase: {len(slow)}"
        + (
            f" ({', '.join(f'{ms:.0f}' for ms in slow[:10])}{', ...' if len(slow) > 10 else ''} ms; the server "
            f"log says where the time went)"
            if slow
            else ""
        )
    )
    print(
        f"request-reply, {args.clients} clients closed-loop: {closed_rr['rate']:.0f} round trips/s, "
        f"p50 {closed_rr['p50_ms']:.1f} ms, p99 {closed_rr['p99_ms']:.1f} ms; {closed_rr['bad']:.0f} failed; "
        f"server CPU {cpu['rr_closed'] * 1e3:.2f} ms per round trip, of which "
        f"{cpu['rr_closed_helpers'] * 1e3:.2f} ms in helper processes (business rules)"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f} (other processes share these {os.cpu_count()} CPUs)")
    print(json.dumps({**results, "server_cpu_per_request_s": cpu}, default=float))
    if args.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


# --------------------------------------------------------------------------- --tls


async def handshakes(host: str, port: int, seconds: float, concurrency: int, tls: ssl.SSLContext) -> float:
    """New TLS connections per second (TCP connect, full handshake, close), *concurrency* at a time."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
            done += 1
            writer.close()
            try:
                await writer.wait_closed()
            except (OSError, ssl.SSLError):
                pass

    started = time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    return done / (time.perf_counter() - started)


def tls_comparison(args: argparse.Namespace) -> int:
    """Plain HTTP, then HTTPS, on the same configuration: the one-way rate (closed loop, keep-alive), the paced
    request-reply p99, and for HTTPS the new handshakes per second (no session resumption)."""
    import trustme

    folder = Path(tempfile.mkdtemp(prefix="b2bgw-bench-tls-"))
    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    leaf.private_key_pem.write_to_path(str(folder / "key.pem"))
    leaf.cert_chain_pems[0].write_to_path(str(folder / "chain.pem"))
    for extra in leaf.cert_chain_pems[1:]:
        extra.write_to_path(str(folder / "chain.pem"), append=True)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)
    bench_key = generate_key("bench")
    results: dict[str, dict] = {}
    print(
        f"b2bgw TLS benchmark: {os.cpu_count()} CPUs, {args.connections} keep-alive connections one-way, "
        f"{args.clients} request-reply clients paced at {args.rate:g}/s, {args.seconds:g} s per phase; "
        f"load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    for mode in ("http", "https"):
        sub = folder / mode
        sub.mkdir()
        config = write_config(sub, bench_key, args.sqlite_synchronous, args.responders, rules=not args.no_rules)
        tls = client_tls if mode == "https" else None
        if tls is not None:
            data = yaml.safe_load(config.read_text())
            data.setdefault("server", {})["tls"] = {
                "certificate": str(folder / "chain.pem"),
                "key": str(folder / "key.pem"),
            }
            config.write_text(yaml.safe_dump(data, sort_keys=False))
        port = free_port()
        base = f"{mode}://127.0.0.1:{port}"
        server = ServerProcess(config, port, sub / "server.log", args.processes, tls=tls)
        try:
            server.wait_ready()
            bench_headers = {"Authorization": f"Bearer {bench_key}", "Content-Type": "application/xml"}
            acme_headers = {"Authorization": f"Bearer {ACME_KEY}", "Content-Type": "application/xml"}
            with httpx.Client(verify=tls if tls is not None else True, timeout=30) as warm:
                for i in range(30):
                    warm.post(f"{base}/v1/documents", content=order_with_id(f"warm-{i}"), headers=bench_headers)
                    warm.post(f"{base}/v1/documents", content=order_with_id(f"warm-rr-{i}"), headers=acme_headers)
            run = uuid.uuid4().hex[:8]
            print(f"{mode}: one-way Orders, closed loop ...", flush=True)
            one_way = asyncio.run(
                closed_loop(
                    f"{base}/v1/documents",
                    bench_headers,
                    args.seconds,
                    args.connections,
                    lambda n, run=run: order_with_id(f"ow{run}-{n}"),
                    202,
                    tls,
                )
            )
            time.sleep(1)
            print(f"{mode}: request-reply, paced ...", flush=True)
            rr = asyncio.run(
                paced(
                    f"{base}/v1/documents",
                    acme_headers,
                    args.seconds,
                    args.clients,
                    args.rate,
                    lambda n, run=run: order_with_id(f"rp{run}-{n}"),
                    200,
                    tls,
                )
            )
            results[mode] = {"one_way": one_way, "request_reply": rr}
            if tls is not None:
                print("https: new handshakes ...", flush=True)
                results[mode]["handshakes_per_s"] = asyncio.run(
                    handshakes("127.0.0.1", port, min(args.seconds, 5.0), 16, tls)
                )
        finally:
            server.stop()
        time.sleep(1)
    print()
    plain, secure = results["http"], results["https"]
    ratio = secure["one_way"]["rate"] / plain["one_way"]["rate"] if plain["one_way"]["rate"] else float("nan")
    print(
        f"one-way accepted: HTTP {plain['one_way']['rate']:.0f}/s, HTTPS {secure['one_way']['rate']:.0f}/s "
        f"({(1 - ratio) * 100:+.1f}% slower; goal within 15%: {'met' if ratio >= 0.85 else 'NOT met'}); failed "
        f"{plain['one_way']['bad']:.0f} / {secure['one_way']['bad']:.0f}"
    )
    print(
        f"request-reply paced p99: HTTP {plain['request_reply']['p99_ms']:.1f} ms, HTTPS "
        f"{secure['request_reply']['p99_ms']:.1f} ms (p50 {plain['request_reply']['p50_ms']:.1f} / "
        f"{secure['request_reply']['p50_ms']:.1f} ms); failed {plain['request_reply']['bad']:.0f} / "
        f"{secure['request_reply']['bad']:.0f}"
    )
    print(f"new TLS handshakes: {secure['handshakes_per_s']:.0f}/s (16 at a time, full handshakes)")
    print(f"load average after: {os.getloadavg()[0]:.2f} (other processes share these {os.cpu_count()} CPUs)")
    print(json.dumps(results, default=float))
    if args.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
