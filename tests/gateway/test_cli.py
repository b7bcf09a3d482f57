"""Tests of the b2bgw command line (gateway.cli) on the sample configuration and a temporary store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_core import AckMode, Broker, Queue
from gateway import cli
from gateway.ledger import Ledger
from gateway.partners import verify_key
from gwtest import FIXTURES, REPO, SAMPLE_CONFIG, UBL_EXAMPLES


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("B2BGW_STORE_URL", url)
    monkeypatch.setenv("B2BGW_CONFIG", str(SAMPLE_CONFIG))
    return url


@pytest.fixture
def shared_schemas(gw_registry, monkeypatch) -> None:
    """Commands on the sample schemas reuse the session's compiled registry (saves ~2 s per command)."""
    import gateway.assemble

    monkeypatch.setattr(gateway.assemble, "build_registry", lambda settings, errors: gw_registry)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_command_prints_help(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "serve" in err and "routes" in err


def test_routes_check_on_the_sample(capsys, store):
    code, out, err = run(capsys, "routes", "check", "--config", str(SAMPLE_CONFIG))
    assert code == 0, err
    assert "OK: 2 partners, 5 routes, 6 schemas" in out
    assert "ubl-order: Order from acme -> queue://orders.inbound (request-reply)" in out


def test_routes_check_reports_every_error_with_file_and_line(capsys, tmp_path, shared_schemas):
    (tmp_path / "b2bgw.yaml").write_text((SAMPLE_CONFIG.read_text()
                                          .replace("partners: partners.yaml", f"partners: {REPO}/config/partners.yaml")
                                          .replace("routes: ../routes/ubl-2.1.yaml", "routes: routes.yaml")))
    routes = (REPO / "routes" / "ubl-2.1.yaml").read_text()
    routes = routes.replace("destination: queue://despatch.inbound", "destination: despatch")
    routes = routes.replace("TotalAmount: {xpath: cac:LegalMonetaryTotal/cbc:PayableAmount, type: double}",
                            "TotalAmount: {xpath: cac:LegalMonetaryTotal/cbc:Payable, type: double}")
    routes = routes.replace("partners: [globex]\n    root: \"{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}",
                            "partners: [globex, initech]\n    root: \"{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}")
    (tmp_path / "routes.yaml").write_text(routes)
    code, out, err = run(capsys, "routes", "check", "--config", str(tmp_path / "b2bgw.yaml"))
    assert code == 1
    lines = [line for line in err.splitlines() if "routes.yaml:" in line]
    assert len(lines) == 2, err  # the initech error stops that route before its properties are checked
    text = (tmp_path / "routes.yaml").read_text().splitlines()
    for line in lines:
        number = int(line.split("routes.yaml:")[1].split(":")[0])
        assert ("despatch" in text[number - 1]) or ("initech" in text[number - 1]), line
    assert "2 errors" in err


def test_key_new_prints_a_key_and_its_hash(capsys):
    code, out, _ = run(capsys, "key", "new", "--id", "initech-1")
    assert code == 0
    key = out.split("): ")[1].split()[0]
    encoded = out.split('hash: "')[1].split('"')[0]
    assert key.startswith("initech-1.") and verify_key(key, encoded)
    assert run(capsys, "key", "new", "--id", "bad id")[0] == 2


def test_db_upgrade(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'up.db'}"
    code, out, _ = run(capsys, "db", "upgrade", "--url", url)
    broker_head = _broker_head_revision()  # the broker's own chain moves with the broker
    assert code == 0 and f"broker tables at revision {broker_head}, ledger tables at revision g0005" in out


def _broker_head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    import broker_core._sql

    cfg = Config()
    cfg.set_main_option("script_location", str(Path(broker_core._sql.__file__).parent / "migrations"))
    return ScriptDirectory.from_config(cfg).get_current_head()


def test_send_queues_browse_and_dlq_replay(capsys, store, shared_schemas):
    code, out, err = run(capsys, "send", str(UBL_EXAMPLES / "UBL-Invoice-2.1-Example.xml"), "--partner", "globex",
                         "--correlation-id", "cli-1")
    assert code == 0, err
    receipt = json.loads(out)
    assert receipt["route"] == "ubl-invoice" and receipt["correlation_id"] == "cli-1"

    code, out, err = run(capsys, "send", str(FIXTURES / "UBL-DespatchAdvice-2.1-Valid.xml"), "--partner", "acme")
    assert code == 1 and '"code": "forbidden-route"' in err

    code, out, _ = run(capsys, "queues")
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("queue://invoices.inbound"))
    assert row.split()[1:4] == ["1", "0", "0"]
    assert any(line.startswith("queue://orders.inbound") for line in out.splitlines())

    code, out, _ = run(capsys, "browse", "invoices.inbound")
    assert code == 0 and receipt["message_id"] in out and '"InvoiceID": "TOSL108"' in out and "1 message in" in out

    # dead-letter it, then replay it
    broker = Broker.open(store, sweep_interval=0, max_deliveries=1)
    conn = broker.connect()
    conn.start()
    session = conn.create_session(False, AckMode.CLIENT)
    assert session.create_consumer(Queue("invoices.inbound")).receive(2) is not None
    session.recover()
    conn.close()
    ledger = Ledger(broker.store.engine)
    broker.close()
    code, out, _ = run(capsys, "queues")
    row = next(line for line in out.splitlines() if line.startswith("queue://invoices.inbound"))
    assert row.split()[1:4] == ["0", "0", "1"]

    code, out, _ = run(capsys, "dlq", "replay", "queue://invoices.inbound")
    assert code == 0 and out.startswith("moved 1 message from queue://DLQ.invoices.inbound")
    assert ledger.get(receipt["message_id"]).status == "accepted"
    code, out, _ = run(capsys, "browse", "queue://invoices.inbound", "--selector", "InvoiceID = 'TOSL108'")
    assert "1 message in" in out
    assert run(capsys, "browse", "topic://x")[0] == 1


def test_serve_builds_the_app_and_runs_uvicorn(capsys, store, monkeypatch, shared_schemas):
    seen = {}

    def fake_run(app, **kwargs):
        seen["app"], seen["kwargs"] = app, kwargs

    import uvicorn

    monkeypatch.setattr(uvicorn, "run", fake_run)
    code, _, err = run(capsys, "serve", "--port", "9999", "--no-access-log")
    assert code == 0, err
    assert seen["kwargs"]["port"] == 9999 and seen["kwargs"]["host"] == "127.0.0.1"
    assert seen["kwargs"]["access_log"] is False
    paths = {route.path for route in seen["app"].routes}
    assert {"/v1/documents", "/v1/documents/{message_id}", "/healthz", "/readyz", "/openapi.json"} <= paths


def test_worker_needs_configured_workers(capsys, tmp_path):
    (tmp_path / "w.yaml").write_text("store: {url: 'sqlite:///" + str(tmp_path / "w.db") + "'}\n")
    code, _, err = run(capsys, "worker", "--config", str(tmp_path / "w.yaml"))
    assert code == 1 and "no 'workers:'" in err


def test_configuration_errors_exit_1(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("server:\n  port: eighty\n")
    code, _, err = run(capsys, "routes", "check", "--config", str(tmp_path / "bad.yaml"))
    assert code == 1 and f"{tmp_path / 'bad.yaml'}:2" in err
    (tmp_path / "bad.yaml").write_text("store:\n  options:\n    local_wakeups: 'off'\n")
    code, _, err = run(capsys, "routes", "check", "--config", str(tmp_path / "bad.yaml"))
    assert code == 1 and f"{tmp_path / 'bad.yaml'}:3: store.options: option local_wakeups must be true or false" in err
