"""No dead code in the packages: vulture reads the packages, the tests and the benchmarks, and reports what
nothing uses. Names that frameworks call by convention are listed here with the reason; the packages'
findings must be empty."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("broker_core", "gateway", "ledger_contract", "spark_etl")

#: Called by a framework or protocol, never by name in our code.
CONVENTIONS = {
    "__getattr__": "a module's lazy attributes (PEP 562)",
    "__dir__": "a module's names for dir() (PEP 562)",
    "r_*": "the selector checker's rules, dispatched by the grammar rule's name",
    "_on_connect": "SQLAlchemy event listener",
    "_on_begin": "SQLAlchemy event listener",
    "isolation_level": "the sqlite3 driver's attribute, set to hand transactions to SQLAlchemy",
    "should_exit": "uvicorn's server flag",
    "total_requests": "uvicorn's server state",
    "data_received": "asyncio.Protocol",
    "create_topic": "JMS Session API (Session.createTopic)",
    "pytestmark": "pytest",
    "anyio_backend": "pytest fixture",
    "do_POST": "http.server",
    "log_message": "http.server",
    "protocol_version": "http.server",
    "daemon_threads": "socketserver",
    "close_connection": "http.server",
    "on_error": "stomp.py listener",
    "on_receipt": "stomp.py listener",
    "get_call_kwargs": "schemathesis hook",
    "additional_checks": "schemathesis hook argument",
}


def test_no_dead_code_in_the_packages() -> None:
    vulture = str(Path(sys.executable).parent / "vulture")
    out = subprocess.run(
        [vulture, *PACKAGES, "tests", "bench", "--min-confidence", "60",
         "--exclude", "*/migrations/*,*/node_modules/*", "--ignore-names", ",".join(CONVENTIONS)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    findings = [line for line in out.stdout.splitlines() if line.startswith(PACKAGES)]
    assert findings == [], "dead code (delete it, or use it):\n" + "\n".join(findings)
