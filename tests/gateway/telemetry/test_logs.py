"""Structured logs: logging.format text | json, the request's context on every line, uvicorn's access line
through the same formatter with its timestamp."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import threading
import time

import httpx
import pytest
from gwtest import GLOBEX, INVOICE, with_id

from gateway.config.loader import settings_from_mapping
from gateway.http.app import create_app
from gateway.telemetry import logs

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def captured():
    """The root logger configured by gateway.telemetry.logs, writing into a buffer; restored afterwards."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    buffers = []

    def configure(fmt: str) -> io.StringIO:
        logs.configure(fmt, logging.INFO)
        buffer = io.StringIO()
        [ours] = [h for h in root.handlers if getattr(h, "_b2bgw", False)]
        ours.setStream(buffer)
        buffers.append(buffer)
        return buffer

    yield configure
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_json_lines_carry_time_level_logger_message_and_the_context(captured):
    buffer = captured("json")

    def request() -> None:  # a request's task: its context ends with it
        logs.bind(partner="acme", message_id="ID:1", correlation_id="PO-1", route="ubl-order")
        logging.getLogger("gateway.test").warning("stored %s", "it")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("gateway.test").exception("failed")

    import contextvars

    contextvars.copy_context().run(request)
    logging.getLogger("gateway.test").info("outside")
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    first, second, third = lines
    assert TS.match(first["ts"])
    assert {
        k: first[k] for k in ("level", "logger", "message", "partner", "message_id", "correlation_id", "route")
    } == {
        "level": "WARNING",
        "logger": "gateway.test",
        "message": "stored it",
        "partner": "acme",
        "message_id": "ID:1",
        "correlation_id": "PO-1",
        "route": "ubl-order",
    }
    assert second["level"] == "ERROR" and "ValueError: boom" in second["exception"]
    assert "partner" not in third and third["message"] == "outside"


def test_text_lines_have_a_timestamp_and_the_context(captured):
    buffer = captured("text")
    import contextvars

    def request() -> None:
        logs.bind(partner="globex", problem="schema-invalid")
        logging.getLogger("gateway.test").info("refused")

    contextvars.copy_context().run(request)
    line = buffer.getvalue().strip()
    assert re.match(
        r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO gateway\.test: refused "
        r"\[partner=globex problem=schema-invalid\]$",
        line,
    ), line


def test_an_unknown_format_is_refused_at_configuration_load(make_assembly, tmp_path):
    from gwtest import SAMPLE_CONFIG, sample_data

    from gateway.errors import ConfigError

    data = sample_data(tmp_path, logging={"format": "xml"})
    with pytest.raises(ConfigError, match="logging.format must be one of text, json"):
        settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)
    data = sample_data(tmp_path, logging={"format": "json"})
    assert settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path).log_format == "json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_uvicorn_access_lines_go_through_the_json_formatter_with_the_request_context(make_assembly, captured):
    import uvicorn

    buffer = captured("json")
    assembly = make_assembly()
    app = create_app(assembly, workers=False, etl=False, reconcile=False)
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_config=logs.uvicorn_log_config(), access_log=True, lifespan="on"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.started
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            ok = client.post("/v1/documents", content=with_id(INVOICE, "INV-LOG"), headers=GLOBEX)
            assert ok.status_code == 202
            refused = client.post("/v1/documents", content=b"<Invoice", headers=GLOBEX)
            assert refused.status_code == 400
    finally:
        server.should_exit = True
        thread.join(30)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]
    access = [line for line in lines if line["logger"] == "uvicorn.access"]
    accepted = next(line for line in access if line.get("status") == 202)
    assert TS.match(accepted["ts"]) and accepted["method"] == "POST" and accepted["path"] == "/v1/documents"
    assert (accepted["partner"], accepted["message_id"], accepted["correlation_id"], accepted["route"]) == (
        "globex",
        ok.headers["x-message-id"],
        ok.headers["x-correlation-id"],
        "ubl-invoice",
    )
    bad = next(line for line in access if line.get("status") == 400)
    assert bad["partner"] == "globex" and bad["problem"] == "not-well-formed" and "message_id" not in bad
    assert any(line["logger"].startswith("uvicorn") and line["logger"] != "uvicorn.access" for line in lines)


def test_configure_replaces_the_gateways_handlers_and_keeps_an_embedding_programs():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    foreign = logging.StreamHandler(io.StringIO())
    try:
        root.addHandler(foreign)
        root.addHandler(logs.own(logging.StreamHandler(io.StringIO())))  # the command line's first handler
        logs.configure("json", logging.INFO)
        logs.configure("json", logging.INFO)
        ours = [h for h in root.handlers if getattr(h, "_b2bgw", False)]
        assert foreign in root.handlers and len(ours) == 1  # one line per record, never two
        assert isinstance(ours[0].formatter, logs.JsonFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
