"""What content-safe idempotency adds to the intake of one accepted document.

    .venv/bin/python bench/idempotency_bench.py [--document PATH] [--repeat 7]

Not a test: numbers depend on the machine. For the document (by default the
14 KB UBL 2.1 Order example) it prints, in microseconds per document (the
best of ``--repeat`` rounds):

* the digest the ledger keeps: SHA-256 (what the gateway uses) and BLAKE2b
  (32 bytes), of the body as received;
* the sender party's extraction from the parsed tree (the route's XPath);
* the idempotency key with and without the party;
* for scale, the parse and schema validation the intake does anyway.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gateway.config.loader import load_settings  # noqa: E402
from gateway.exchange.assemble import assemble_or_raise  # noqa: E402
from gateway.exchange.keys import idempotency_key  # noqa: E402
from gateway.exchange.submission import document_digest  # noqa: E402
from gateway.intake.xmlsafe import parse_document_text  # noqa: E402

ORDER = REPO.parent / "shared" / "ubl-2.1" / "xml" / "UBL-Order-2.1-Example.xml"


def per_call(fn: Callable[[], Any], repeat: int, budget: float = 0.2) -> float:
    """Microseconds per call of *fn*: the best of *repeat* rounds of about *budget* seconds each."""
    n = 1
    while True:  # calls per round: about budget seconds
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed > budget / 10:
            break
        n *= 2
    n = max(1, int(n * budget / elapsed))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--document", type=Path, default=ORDER)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)

    body = args.document.read_bytes()
    assembly = assemble_or_raise(load_settings(REPO / "config" / "b2bgw.yaml"))
    limits = assembly.settings.limits
    root, _ = parse_document_text(body, limits)
    route = assembly.routes.select(root, "acme")
    doc_id = route.extract_document_id(root)
    party = route.extract_sender_party(root)
    print(f"{args.document.name}: {len(body):,} bytes, route {route.id}, id {doc_id!r}, sender party {party!r}")

    rows = [
        ("digest sha256 (used)", lambda: document_digest(body)),
        ("digest blake2b-256", lambda: "blake2b:" + hashlib.blake2b(body, digest_size=32).hexdigest()),
        ("sender party (XPath)", lambda: route.extract_sender_party(root)),
        ("key with party", lambda: idempotency_key("acme", route, doc_id, None, party)),
        ("key without party", lambda: idempotency_key("acme", route, doc_id, None)),
        ("parse (for scale)", lambda: parse_document_text(body, limits)),
        ("validate (for scale)", lambda: assembly.registry.is_valid(root, route.schema)),
    ]
    timings = {}
    for name, fn in rows:
        timings[name] = per_call(fn, args.repeat)
        print(f"  {name:<24} {timings[name]:8.2f} us")
    added = (
        timings["digest sha256 (used)"]
        + timings["sender party (XPath)"]
        + timings["key with party"]
        - timings["key without party"]
    )
    print(f"  {'added per document':<24} {added:8.2f} us  (digest + party + the longer key)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
