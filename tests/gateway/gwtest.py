"""Helpers of the gateway's HTTP-level tests: sample documents, demo keys, the
sample settings on a temporary store, and an in-test order responder thread.

Imported by ``conftest.py`` (which puts this folder on ``sys.path``) and by
the test modules (``from gwtest import ...``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable as _Callable
from collections.abc import Iterator as _Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from broker_core import Broker, Queue, XMLMessage
from gateway.config.loader import load_yaml
from gateway.exchange.assemble import Assembly
from gateway.runtime.serving import Runtime
from gateway.samples.order_responder import build_order_response

REPO = Path(__file__).resolve().parents[2]
SAMPLE_CONFIG = REPO / "config" / "b2bgw.yaml"
UBL_EXAMPLES = REPO.parent / "shared" / "ubl-2.1" / "xml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"

ACME_KEY = "acme-demo.EOSR0zYti7vSYAzgLvqVss8uQCIXEmWO3fDuUsmKiIA"
GLOBEX_KEY = "globex-demo.gtQ0VQHxnHu2x3aBBqlE_TqHsM5svX9Dzw52xGagUfA"
ACME = {"Authorization": f"Bearer {ACME_KEY}", "Content-Type": "application/xml"}
GLOBEX = {"Authorization": f"Bearer {GLOBEX_KEY}", "Content-Type": "application/xml"}

ORDER = (UBL_EXAMPLES / "UBL-Order-2.1-Example.xml").read_bytes()
INVOICE = (UBL_EXAMPLES / "UBL-Invoice-2.1-Example.xml").read_bytes()
ORDER_CHANGE = (UBL_EXAMPLES / "UBL-OrderChange-2.1-Example.xml").read_bytes()
ORDER_CANCELLATION = (UBL_EXAMPLES / "UBL-OrderCancellation-2.1-Example.xml").read_bytes()
DESPATCH_ADVICE = (FIXTURES / "UBL-DespatchAdvice-2.1-Valid.xml").read_bytes()


def with_id(document: bytes, new_id: str) -> bytes:
    """The document with its first ``<cbc:ID>`` (the document id) replaced."""
    start = document.index(b"<cbc:ID>") + len(b"<cbc:ID>")
    end = document.index(b"</cbc:ID>", start)
    return document[:start] + new_id.encode() + document[end:]


def sample_data(tmp_path: Path, *, business_rules: bool = False, **changes: Any) -> Any:
    """The sample configuration as a marked mapping, partners and routes inlined, store in tmp_path.

    Without *business_rules* the routes apply no rule set (each gateway would otherwise start its rules
    worker processes); with it, the sample rule sets are used from the repository."""
    data = load_yaml(SAMPLE_CONFIG)
    data["partners"] = load_yaml(REPO / "config" / "partners.yaml")["partners"]
    data["routes"] = load_yaml(REPO / "routes" / "ubl-2.1.yaml")["routes"]
    if business_rules:
        for entry in data["rules"]["sets"].values():
            entry["file"] = str((SAMPLE_CONFIG.parent / entry["file"]).resolve())
    else:
        del data["rules"]
        for route in data["routes"]:
            route.pop("rules", None)
    data["store"]["url"] = f"sqlite:///{tmp_path / 'gw.db'}"
    data["store"]["options"] = {"max_deliveries": 2, "sweep_interval": 0}
    data["workers"] = []
    data["etl"] = {"enabled": False}
    data["exchange"] = {"reconcile_interval": "100ms", "late_reply_window": "1m"}
    for route in data["routes"]:
        if route.get("exchange") == "request-reply":
            route["timeout"] = "1500ms"
    data.update(changes)
    return data


# --------------------------------------------------------------------------- an in-test responder


@dataclass
class Responder:
    """Answers requests on a queue from its own thread, as a test says.

    ``mode``: "reply" (a UBL OrderResponse), "error" (a reply with B2BError),
    "silent" (consume, never answer), "late" (answer after ``delay`` s).
    """

    broker: Broker
    queue: str = "orders.inbound"
    mode: str = "reply"
    delay: float = 0.0
    seen: list[Any] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Responder:
        self._thread = threading.Thread(target=self._run, name="test-responder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        conn = self.broker.connect()
        conn.start()
        session = conn.create_session(False)
        consumer = session.create_consumer(Queue(self.queue))
        producer = session.create_producer(None)
        try:
            while not self._stop.is_set():
                request = consumer.receive(0.05)
                if request is None:
                    continue
                self.seen.append(request)
                if self.mode == "silent" or request.jms_reply_to is None:
                    continue
                if self.mode == "late":
                    threading.Thread(target=self._late, args=(request,), daemon=True).start()
                    continue
                self._answer(producer, request)
        finally:
            conn.close()

    def _answer(self, producer: Any, request: Any) -> None:
        reply = XMLMessage()
        if self.mode == "error":
            reply.text = "<Error>no stock</Error>"
            reply.set_string_property("B2BError", "item SItemNo001 is out of stock")
        else:
            from lxml import etree

            reply.text = etree.tostring(build_order_response(request.document()), encoding="unicode")
            reply.jms_type = "OrderResponse"
        reply.jms_correlation_id = request.jms_correlation_id or request.jms_message_id
        producer.send(request.jms_reply_to, reply)

    def _late(self, request: Any) -> None:
        time.sleep(self.delay)
        conn = self.broker.connect()
        try:
            session = conn.create_session(False)
            self._answer(session.create_producer(None), request)
        finally:
            conn.close()


@dataclass
class GatewayEnv:
    assembly: Assembly
    runtime: Runtime
    app: Any
    client: httpx.AsyncClient
    responder: Responder

    @property
    def broker(self) -> Broker:
        assert self.runtime.broker is not None
        return self.runtime.broker

    @property
    def gateway(self) -> Any:
        return self.runtime.gateway

    def depth(self, queue: str) -> int:
        return len(list(self.broker.browse(Queue(queue))))

    def messages(self, queue: str) -> list[Any]:
        return list(self.broker.browse(Queue(queue)))

    def ledger_rows(self) -> list[Any]:
        """The ``b2b_ledger`` rows, with ``document`` and ``reply`` as the XML they hold (stored compressed
        when large: ``ledger_contract.tables.pack_xml``)."""
        from types import SimpleNamespace

        import sqlalchemy as sa

        from ledger_contract.tables import documents, unpack_xml

        with self.broker.engine.connect() as conn:
            rows = [row._asdict() for row in conn.execute(sa.select(documents))]
        return [
            SimpleNamespace(**{**row, "document": unpack_xml(row["document"]), "reply": unpack_xml(row["reply"])})
            for row in rows
        ]


@contextmanager
def listening_socket() -> _Iterator[tuple[int, _Callable[[], int]]]:
    """A local TCP listener; yields its port and a function counting connections made to it
    (hostile documents must never make the parser connect anywhere)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)

    def connections() -> int:
        count = 0
        while True:
            try:
                conn, _ = server.accept()
            except (BlockingIOError, InterruptedError):
                return count
            conn.close()
            count += 1

    try:
        yield server.getsockname()[1], connections
    finally:
        server.close()
