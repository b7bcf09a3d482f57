"""Rough speed of JMS message selectors: compile time and evaluations per second.

    .venv/bin/python bench/selector_bench.py [--seconds 0.5]

Not a test: numbers depend on the machine. For each selector it prints the
mean compile time and evaluations per second against a message it matches
and one it does not. A hand-written Python function doing the first
selector's work is timed as a floor to compare with. The last rows take
messages as STOMP sends them (every property a string): marked for
selectors that read such strings as numbers, and unmarked (the JMS rule).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from broker_core import Int, TextMessage, XMLMessage
from broker_core.selectors import STRING_NUMBERS_PROPERTY, Envelope, compile_selector, snapshot

NS = {"cbc": "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"}
XML = (
    f"<Invoice xmlns:cbc='{NS['cbc']}'><cbc:ID>7</cbc:ID>"
    + "".join(f"<Line n='{i}'><cbc:Amount>{i * 10}</cbc:Amount></Line>" for i in range(20))
    + "</Invoice>"
)


def envelope(props: dict, *, body: str | None = None, type_: str | None = "invoice") -> Envelope:
    message = XMLMessage(body) if body else TextMessage()
    message.jms_type, message.jms_timestamp = type_, 1000
    for name, value in props.items():
        message.set_object_property(name, value)
    return snapshot(message)


HIT = {
    "partner": "acme",
    "amount": 125.5,
    "region": "EU",
    "urgent": True,
    "doc": "INV-2024-001",
    "fee": Int(3),
    "a": 5,
    "b": 1,
    "c": "x",
}
MISS = {
    "partner": "globex",
    "amount": Int(50),
    "region": "LATAM",
    "urgent": False,
    "doc": "PO-7",
    "fee": Int(3),
    "a": 0,
    "b": 9,
}

CASES = [
    "partner = 'acme' AND amount > 100",
    "JMSType = 'invoice' AND region IN ('EU', 'US', 'APAC') AND urgent",
    "doc LIKE 'INV-%' AND amount BETWEEN 100 AND 5000",
    "doc LIKE 'INV-%-0_1' OR doc LIKE '%-9%'",
    "(a > 1 OR b < 2) AND NOT c IS NULL AND JMSPriority >= 4",
    "amount * 1.2 > 100 + fee",
    "XPATH '/Invoice/cbc:ID = 7' AND partner = 'acme'",
]


def rate(fn, arg, seconds: float) -> float:
    """Calls per second of fn(arg), measured for about ``seconds``."""
    n, elapsed = 1000, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn(arg)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed
        n = int(n * max(2.0, seconds / max(elapsed, 1e-9) * 1.1))


def compile_time(text: str, repeat: int = 200) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        compile_selector(text, xpath_namespaces=NS)
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement (default 0.5)")
    args = parser.parse_args()

    compile_selector("warm = 1")  # builds the lark parser once
    hit = envelope(HIT, body=XML)
    miss = envelope(MISS, body=XML.replace(">7<", ">8<"), type_="order")
    print(f"Python {sys.version.split()[0]}")
    print(f"{'selector':<66} {'compile':>9} {'match/s':>11} {'no match/s':>11}")
    for text in CASES:
        sel = compile_selector(text, xpath_namespaces=NS)
        assert sel.matches(hit) and not sel.matches(miss), text
        ms = compile_time(text) * 1000
        print(
            f"{text:<66} {ms:>7.3f}ms {rate(sel.matches, hit, args.seconds):>11,.0f} "
            f"{rate(sel.matches, miss, args.seconds):>11,.0f}"
        )

    stomp_hit = envelope({STRING_NUMBERS_PROPERTY: True, "partner": "acme", "amount": "125.5"})
    stomp_miss = envelope({STRING_NUMBERS_PROPERTY: True, "partner": "acme", "amount": "50"})
    strict = envelope({"partner": "acme", "amount": "125.5"})
    for text in ("partner = 'acme' AND amount > 100", "amount BETWEEN 100 AND 5000"):
        sel = compile_selector(text)
        assert sel.matches(stomp_hit) and not sel.matches(stomp_miss) and not sel.matches(strict), text
        label = f"{text} (STOMP strings)"
        print(
            f"{label:<66} {'':>9} {rate(sel.matches, stomp_hit, args.seconds):>11,.0f} "
            f"{rate(sel.matches, stomp_miss, args.seconds):>11,.0f}"
        )
        label = f"{text} (strings, JMS rule)"
        print(f"{label:<66} {'':>9} {'-':>11} {rate(sel.matches, strict, args.seconds):>11,.0f}")

    def by_hand(e: Envelope) -> bool:  # the first selector, written directly
        p = e.properties
        partner, amount = p.get("partner"), p.get("amount")
        return partner.__class__ is str and partner == "acme" and amount.__class__ in (int, float, Int) and amount > 100

    print(
        f"{'(hand-written Python for the first selector)':<66} {'':>9} {rate(by_hand, hit, args.seconds):>11,.0f} "
        f"{rate(by_hand, miss, args.seconds):>11,.0f}"
    )


if __name__ == "__main__":
    main()
