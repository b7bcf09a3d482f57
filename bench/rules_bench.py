"""Benchmark of the business rules (ISO Schematron on SaxonC-HE). Prints, in one run:

1. compile time of each rule set: cold (Schematron to XSLT, then Saxon), from the on-disk cache (what a
   restart costs: the cached stylesheet compiled by Saxon), and a rules worker process's start;
2. the engine alone, in this process, one thread, on the UBL Order example: documents/s with Saxon's
   parse of the document included, and with the document parsed once (the rules alone); for the sample
   rule set (rules/ubl-order.sch) and for bench/rules/order-100.sch (100 assertions with functions, keys
   and code lists, written for this benchmark);
3. the same through one worker process (the pipe and the process switch included), as the gateway runs it;
4. the gateway's one-way rate: accepted Orders/s on a route applying the sample rule set against the same
   route without it, in one server (``b2bgw serve``, SQLite store in a temporary folder), phases
   interleaved (without, with, without, with) so that a drift of the shared machine hits both.

Goals: (2) >= 1,000 documents/s with the sample rule set and >= 600/s with order-100, parse included;
(1) under 1 s from the cache; (4) the rate with rules >= 70% of the rate without.

Usage::

    .venv/bin/python bench/rules_bench.py [--seconds 5] [--gateway-seconds 10] [--connections 100] [--no-gateway]

Timing figures on a shared machine are noisy: each is the median of repeated runs where it says so.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

import gateway_bench as gb  # noqa: E402

from gateway.intake.xmlsafe import parse_document_text  # noqa: E402
from gateway.routing.partners import generate_key, hash_key  # noqa: E402
from gateway.rules.rulesets import RuleBook, RuleSet, RulesRunner  # noqa: E402
from gateway.rules.schematron import SaxonRules, compile_schematron, document_text, load_schematron  # noqa: E402

SAMPLE_RULES = REPO / "rules" / "ubl-order.sch"
BENCH_RULES = BENCH / "rules" / "order-100.sch"
ORDER = gb.ORDER


def _text() -> str:
    root, decoded = parse_document_text(ORDER)
    return document_text(root, decoded)


# --------------------------------------------------------------------------- 1. compile


def compile_times(path: Path, cache: Path, rounds: int = 3) -> dict[str, float]:
    cold, cached = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        SaxonRules().add(compile_schematron(path))
        cold.append(time.perf_counter() - started)
    load_schematron(path, cache_dir=cache)  # fills the cache
    for _ in range(rounds):
        started = time.perf_counter()
        compiled = load_schematron(path, cache_dir=cache)
        SaxonRules().add(compiled)
        cached.append(time.perf_counter() - started)
        assert compiled.from_cache
    book = RuleBook({"bench": RuleSet("bench", load_schematron(path, cache_dir=cache))})
    starts = []
    for _ in range(rounds):
        runner = RulesRunner(book, workers=1)
        started = time.perf_counter()
        runner.start()
        starts.append(time.perf_counter() - started)
        runner.stop()
    return {
        "cold": statistics.median(cold),
        "cached": statistics.median(cached),
        "worker_start": statistics.median(starts),
        "assertions": len(compiled.assertions),
    }


# --------------------------------------------------------------------------- 2. the engine alone


def _rate(step, seconds: float) -> tuple[float, float]:
    """Calls per second (wall) and CPU microseconds per call of *step* over *seconds*."""
    for _ in range(50):
        step()
    count = 0
    wall, cpu = time.perf_counter(), time.process_time()
    deadline = wall + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            step()
        count += 20
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return count / wall, cpu / count * 1e6


def engine_rates(path: Path, seconds: float) -> dict[str, float]:
    rules = SaxonRules()
    rules.add(compile_schematron(path))
    rules.lock()
    text = _text()
    executable = rules.sets[0][1]
    # the rules alone: on documents Saxon parsed beforehand, each used once (a document's key indexes are
    # built on its first use: running the rules again on one document would measure less than a new one costs)
    nodes = [rules.parse(text) for _ in range(1000)]
    for node in nodes[:50]:
        executable.set_global_context_item(xdm_item=node)
        executable.apply_templates_returning_string(xdm_value=node, encoding="UTF-8")
    wall, cpu = time.perf_counter(), time.process_time()
    for node in nodes[50:]:
        executable.set_global_context_item(xdm_item=node)
        executable.apply_templates_returning_string(xdm_value=node, encoding="UTF-8")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    alone, alone_cpu = (len(nodes) - 50) / wall, cpu / (len(nodes) - 50) * 1e6
    del nodes
    with_parse, with_parse_cpu = _rate(lambda: rules.run(text), seconds)
    parse, parse_cpu = _rate(lambda: rules.parse(text), seconds / 2)
    return {
        "with_parse": with_parse,
        "with_parse_cpu_us": with_parse_cpu,
        "alone": alone,
        "alone_cpu_us": alone_cpu,
        "parse": parse,
        "parse_cpu_us": parse_cpu,
        "findings": len(rules.run(text)),
    }


# --------------------------------------------------------------------------- 3. through a worker process


def worker_rate(path: Path, seconds: float) -> tuple[float, float, float]:
    """Documents/s through one worker process, one at a time, and the CPU microseconds per document of this
    process (the pipe, the event loop) and of the worker."""
    book = RuleBook({"bench": RuleSet("bench", compile_schematron(path))})
    runner = RulesRunner(book, workers=1, seconds=30)
    runner.start()
    text = _text()
    stat = Path(f"/proc/{runner._workers[0].process.pid}/stat")

    def worker_cpu() -> float:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def run() -> tuple[float, float, float]:
        for _ in range(50):
            await runner.submit(["bench"], text)
        count = 0
        wall, cpu, other = time.perf_counter(), time.process_time(), worker_cpu()
        deadline = wall + seconds
        while time.perf_counter() < deadline:
            await runner.submit(["bench"], text)
            count += 1
        wall, cpu, other = time.perf_counter() - wall, time.process_time() - cpu, worker_cpu() - other
        return count / wall, cpu / count * 1e6, other / count * 1e6

    try:
        return asyncio.run(run())
    finally:
        runner.stop()


# --------------------------------------------------------------------------- 4. the gateway


def gateway_rates(seconds: float, connections: int, use_wrk: bool) -> dict[str, list[float]]:
    folder = Path(tempfile.mkdtemp(prefix="b2bgw-rules-bench-"))
    plain_key, rules_key = generate_key("bench"), generate_key("benchrules")
    config_path = gb.write_config(folder, plain_key)
    config = yaml.safe_load(config_path.read_text())
    config["partners"]["benchrules"] = {
        "name": "Benchmark client (rules)",
        "keys": [{"id": "benchrules", "hash": hash_key(rules_key, ln=10)}],
    }
    plain = next(r for r in config["routes"] if r["id"] == "bench-order-one-way")
    config["routes"].append(
        {
            **plain,
            "id": "bench-order-rules",
            "partners": ["benchrules"],
            "destination": "queue://orders.bench-rules",
            "rules": ["ubl-order"],
        }
    )
    config["rules"]["sets"]["ubl-order"]["file"] = str(SAMPLE_RULES)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = gb.free_port()
    base = f"http://127.0.0.1:{port}"
    server = gb.ServerProcess(config_path, port, folder / "server.log")
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu: dict[str, list[float]] = {"without": [], "with": []}
    try:
        server.wait_ready()
        run = uuid.uuid4().hex[:8]
        headers = {
            "without": {"Authorization": f"Bearer {plain_key}", "Content-Type": "application/xml"},
            "with": {"Authorization": f"Bearer {rules_key}", "Content-Type": "application/xml"},
        }
        import httpx

        for kind in ("without", "with"):  # warm up: keys, routes, the rules workers
            for i in range(50):
                response = httpx.post(
                    f"{base}/v1/documents",
                    content=gb.order_with_id(f"warm-{kind}-{i}"),
                    headers=headers[kind],
                    timeout=30,
                )
                assert response.status_code == 202, response.text
        for round_ in range(2):
            for kind in ("without", "with"):
                tag = f"{kind[0]}{round_}{run}"
                before = server.cpu_seconds()
                if use_wrk:
                    script = gb.wrk_script(folder / f"{tag}.lua", headers[kind], unique=True)
                    result = gb.run_wrk(base, script, seconds, connections, [tag])
                else:
                    result = asyncio.run(
                        gb.closed_loop(
                            f"{base}/v1/documents",
                            headers[kind],
                            seconds,
                            connections,
                            lambda n, t=tag: gb.order_with_id(f"{t}-{n}"),
                            202,
                        )
                    )
                if result["bad"]:
                    print(f"   ({result['bad']:.0f} requests failed in the {kind} phase: see {folder / 'server.log'})")
                rates[kind].append(result["rate"])
                cpu[kind].append((server.cpu_seconds() - before) / max(1, result["total"]) * 1e6)
                print(
                    f"   {kind} rules: {result['rate']:.0f} orders/s, {cpu[kind][-1]:.0f} us server CPU per order",
                    flush=True,
                )
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return {"rates": rates, "cpu": cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each engine measurement")
    parser.add_argument("--gateway-seconds", type=float, default=10.0, help="duration of each gateway phase")
    parser.add_argument("--connections", type=int, default=100, help="concurrent clients of the gateway phases")
    parser.add_argument("--no-gateway", action="store_true", help="skip (4)")
    parser.add_argument("--no-wrk", action="store_true", help="use the asyncio client even if wrk is installed")
    args = parser.parse_args()
    use_wrk = shutil.which("wrk") is not None and not args.no_wrk
    print(
        f"b2bgw business rules benchmark: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{len(ORDER)} byte UBL Order example; load average before: {os.getloadavg()[0]:.2f}",
        flush=True,
    )

    cache = Path(tempfile.mkdtemp(prefix="b2bgw-rules-cache-"))
    results = {}
    try:
        print("1. compile times ...", flush=True)
        for name, path in (("sample", SAMPLE_RULES), ("order-100", BENCH_RULES)):
            results[f"compile {name}"] = compile_times(path, cache)
        print("2. the engine alone, one thread ...", flush=True)
        for name, path in (("sample", SAMPLE_RULES), ("order-100", BENCH_RULES)):
            results[f"engine {name}"] = engine_rates(path, args.seconds)
        print("3. through one worker process ...", flush=True)
        for name, path in (("sample", SAMPLE_RULES), ("order-100", BENCH_RULES)):
            results[f"worker {name}"] = worker_rate(path, args.seconds)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    gateway = None
    if not args.no_gateway:
        print(
            f"4. the gateway, one-way Orders with and without the sample rules "
            f"({'wrk' if use_wrk else 'asyncio client'}, {args.connections} connections, "
            f"{args.gateway_seconds:g} s per phase) ...",
            flush=True,
        )
        gateway = gateway_rates(args.gateway_seconds, args.connections, use_wrk)

    print()
    for name in ("sample", "order-100"):
        c = results[f"compile {name}"]
        print(
            f"compile {name} ({c['assertions']} assertions): cold {c['cold'] * 1000:.0f} ms, from the cache "
            f"{c['cached'] * 1000:.0f} ms (goal < 1 s: {'met' if c['cached'] < 1 else 'NOT met'}), a worker "
            f"process's start {c['worker_start'] * 1000:.0f} ms (medians of 3)"
        )
    goals = {"sample": 1000, "order-100": 600}
    for name in ("sample", "order-100"):
        e = results[f"engine {name}"]
        print(
            f"engine {name}: {e['with_parse']:.0f} documents/s with the parse ({e['with_parse_cpu_us']:.0f} us CPU "
            f"each; goal >= {goals[name]}: {'met' if e['with_parse'] >= goals[name] else 'NOT met'}), "
            f"{e['alone']:.0f}/s on documents parsed beforehand ({e['alone_cpu_us']:.0f} us CPU), "
            f"Saxon's parse alone "
            f"{e['parse']:.0f}/s ({e['parse_cpu_us']:.0f} us CPU); {e['findings']} findings per document"
        )
        rate, parent_cpu, worker_cpu = results[f"worker {name}"]
        print(
            f"   through one worker process: {rate:.0f} documents/s ({worker_cpu:.0f} us CPU in the worker, "
            f"{parent_cpu:.0f} us in the gateway's process per document)"
        )
    if gateway is not None:
        without = statistics.mean(gateway["rates"]["without"])
        with_rules = statistics.mean(gateway["rates"]["with"])
        share = with_rules / without if without else 0.0
        print(
            f"gateway one-way: {with_rules:.0f} orders/s with the sample rules against {without:.0f} without = "
            f"{share:.0%} (goal >= 70%: {'met' if share >= 0.7 else 'NOT met'}); server CPU per order "
            f"{statistics.mean(gateway['cpu']['with']):.0f} us with, {statistics.mean(gateway['cpu']['without']):.0f}"
            f" us without (runs: {', '.join(f'{r:.0f}' for r in gateway['rates']['without'])} without; "
            f"{', '.join(f'{r:.0f}' for r in gateway['rates']['with'])} with)"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f} (other processes share these {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
