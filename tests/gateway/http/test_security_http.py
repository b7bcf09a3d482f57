"""Hostile XML end to end: through a real HTTP server (uvicorn on loopback).

Each attack must be refused with the right status, and the content of the
local file an entity names must appear nowhere: not in any response (body or
headers), not in any queued message, not in the ledger, not in any log line.
No network connection may be attempted either.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from gwtest import GLOBEX, INVOICE, sample_data

from broker_core import Broker
from gateway.http.app import create_app
from ledger_contract.tables import documents, events, unpack_xml

SECRET = f"TOP-SECRET-{uuid.uuid4().hex}"
INVOICE_NS = "urn:oasis:names:specification:ubl:schema:xsd:Invoice-2"


class Server:
    def __init__(self, app) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="info", lifespan="on", access_log=True)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "secret.txt"
    path.write_text(SECRET + "\n")
    return path


@pytest.fixture(scope="module")
def listener() -> Iterator[tuple[int, list[int]]]:
    """A listening socket that counts connections (none may come)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(5)
    sock.settimeout(0.05)
    accepted = [0]
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
                accepted[0] += 1
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield sock.getsockname()[1], accepted
    stop.set()
    thread.join(2)
    sock.close()


class LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
        except Exception:
            self.lines.append(str(record.msg))


@pytest.fixture(scope="module")
def server(make_module_assembly) -> Iterator[tuple[Server, Path, LogCapture]]:
    assembly, store_path = make_module_assembly
    capture = LogCapture()
    capture.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        with Server(create_app(assembly, workers=False, etl=False)) as srv:
            yield srv, store_path, capture
    finally:
        root.removeHandler(capture)
        root.setLevel(old_level)


@pytest.fixture(scope="module")
def make_module_assembly(gw_registry, tmp_path_factory):
    from gwtest import SAMPLE_CONFIG

    from gateway.config.loader import settings_from_mapping
    from gateway.exchange.assemble import assemble

    tmp = tmp_path_factory.mktemp("gw-security")
    data = sample_data(tmp)
    data["limits"] = {"max_body_bytes": 200_000, "max_depth": 64}
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp)
    assembly = assemble(settings, registry=gw_registry)
    assert not assembly.errors
    return assembly, tmp / "gw.db"


def attacks(secret_path: Path, port: int) -> list[tuple[str, bytes, int, str]]:
    uri = secret_path.as_uri()
    body = INVOICE.decode().split("?>", 1)[1]  # the invoice without its XML declaration
    inv_open = f'<Invoice xmlns="{INVOICE_NS}" xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">'
    xi_open = inv_open.replace(">", ' xmlns:xi="http://www.w3.org/2001/XInclude">', 1)
    return [
        (
            "external general entity",
            f'<?xml version="1.0"?><!DOCTYPE Invoice [<!ENTITY x SYSTEM "{uri}">]>'
            f"{inv_open}<cbc:ID>&x;</cbc:ID></Invoice>".encode(),
            400,
            "forbidden-xml",
        ),
        (
            "entity in a valid invoice",
            f'<?xml version="1.0"?><!DOCTYPE Invoice [<!ENTITY x SYSTEM "{uri}">]>'
            f"{body.replace('<cbc:Note>', '<cbc:Note>&x;', 1)}".encode(),
            400,
            "forbidden-xml",
        ),
        (
            "external DTD subset",
            f'<!DOCTYPE Invoice SYSTEM "{uri}">{inv_open}</Invoice>'.encode(),
            400,
            "forbidden-xml",
        ),
        (
            "external parameter entity",
            f'<!DOCTYPE Invoice [<!ENTITY % p SYSTEM "{uri}"> %p;]>{inv_open}</Invoice>'.encode(),
            400,
            "forbidden-xml",
        ),
        (
            "network entity",
            f'<!DOCTYPE Invoice [<!ENTITY x SYSTEM "http://127.0.0.1:{port}/x">]>{inv_open}&x;</Invoice>'.encode(),
            400,
            "forbidden-xml",
        ),
        ("undeclared entity", f"{inv_open}<cbc:ID>&secret;</cbc:ID></Invoice>".encode(), 400, "forbidden-xml"),
        ("xinclude", f'{xi_open}<xi:include href="{uri}" parse="text"/></Invoice>'.encode(), 400, "schema-invalid"),
        (
            "billion laughs",
            (Path(__file__).parents[1] / "fixtures" / "billion-laughs.xml").read_bytes(),
            400,
            "forbidden-xml",
        ),
        ("deep nesting", b"<a>" * 5000 + b"</a>" * 5000, 400, "forbidden-xml"),
        ("nesting over the configured depth", b"<a>" * 70 + b"</a>" * 70, 400, "forbidden-xml"),
    ]


def assert_clean(response: httpx.Response) -> None:
    assert SECRET not in response.text
    for _name, value in response.headers.items():
        assert SECRET not in value


def test_every_attack_is_refused_and_leaks_nothing(server, secret_file, listener):
    srv, store_path, capture = server
    port, accepted = listener
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for name, document, status, code in attacks(secret_file, port):
            started = time.monotonic()
            response = client.post("/v1/documents", content=document, headers=GLOBEX)
            assert response.status_code == status, (name, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["code"] == code, name
            assert time.monotonic() - started < 5, name
            assert_clean(response)
        # a well-behaved document still goes through on the same server
        ok = client.post("/v1/documents", content=INVOICE, headers=GLOBEX)
        assert ok.status_code == 202
    assert accepted[0] == 0  # no network fetch was attempted

    # nothing queued or recorded holds the secret; only the good invoice was accepted
    broker = Broker.open(f"sqlite:///{store_path}", sweep_interval=0)
    try:
        for stats in broker.destinations():
            for message in broker.browse(stats.name):
                assert SECRET not in (getattr(message, "text", "") or "")
                assert SECRET not in repr(message.property_names())
        engine = broker.engine
        with engine.connect() as conn:
            rows = list(conn.execute(sa.select(documents)))
            assert len(rows) == 1
            for row in rows:
                assert SECRET.encode() not in unpack_xml(row.document) and SECRET not in (row.receipt or "")
            assert len(list(conn.execute(sa.select(events)))) == 1
    finally:
        broker.close()
    assert capture.lines  # the server did log (access log, startup)
    assert not [line for line in capture.lines if SECRET in line]


def test_oversize_with_and_without_content_length(server):
    srv, _, _ = server
    big = b"<Invoice>" + b"x" * 300_000 + b"</Invoice>"
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        declared = client.post("/v1/documents", content=big, headers=GLOBEX)
        assert declared.status_code == 413
        assert declared.json()["code"] == "document-too-large"

    def chunks():
        for _ in range(40):
            yield b"x" * 16384

    with httpx.Client(base_url=srv.url, timeout=30) as client:
        streamed = client.post("/v1/documents", content=chunks(), headers=GLOBEX)
        assert streamed.status_code == 413
        assert "content-length" not in {k.lower() for k in streamed.request.headers}  # it really was chunked
    with httpx.Client(base_url=srv.url, timeout=30) as client:  # the server is fine afterwards
        assert client.get("/healthz").status_code == 200


def test_wrong_media_types_are_415(server):
    srv, _, _ = server
    with httpx.Client(base_url=srv.url, timeout=30) as client:
        for content_type in [
            None,
            "application/json",
            "text/plain",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
            "application/xml; charset=klingon",
        ]:
            headers = {k: v for k, v in GLOBEX.items() if k != "Content-Type"}
            if content_type:
                headers["Content-Type"] = content_type
            response = client.post("/v1/documents", content=INVOICE, headers=headers)
            assert response.status_code == 415, content_type
            assert response.json()["code"] == "unsupported-media-type"
