"""Tests of the b2bgw command line (gateway.cli.main) on the sample configuration and a temporary store."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import socket
from pathlib import Path

import pytest
from gwtest import FIXTURES, REPO, SAMPLE_CONFIG, UBL_EXAMPLES

from broker_core import AckMode, Broker, Queue
from gateway.cli import main as cli
from gateway.cli import queues as queue_cli
from gateway.cli import serve as serve_cli
from gateway.ledger.records import Ledger


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("B2BGW_STORE_URL", url)
    monkeypatch.setenv("B2BGW_CONFIG", str(SAMPLE_CONFIG))
    return url


@pytest.fixture
def shared_schemas(gw_registry, monkeypatch) -> None:
    """Commands on the sample schemas reuse the session's compiled registry (saves ~2 s per command)."""
    import gateway.exchange.assemble

    monkeypatch.setattr(gateway.exchange.assemble, "build_registry", lambda settings, errors: gw_registry)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own exits (--version, --help, usage errors)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def user_error(result: tuple[int, str, str]) -> str:
    """The one line a user error prints (exit status 2, no traceback)."""
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    return lines[0]


def test_no_command_prints_help(capsys):
    code, _, err = run(capsys)
    assert code == 2 and "serve" in err and "routes" in err


def test_routes_check_on_the_sample(capsys, store):
    code, out, err = run(capsys, "routes", "check", "--config", str(SAMPLE_CONFIG))
    assert code == 0, err
    assert "OK: 2 partners, 5 routes, 6 schemas" in out
    assert "ubl-order: Order from acme -> queue://orders.inbound (request-reply)" in out


def test_routes_check_reports_every_error_with_file_and_line(capsys, tmp_path, shared_schemas):
    (tmp_path / "b2bgw.yaml").write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {REPO}/config/partners.yaml")
        .replace("routes: ../routes/ubl-2.1.yaml", "routes: routes.yaml")
        .replace("file: ../rules/", f"file: {REPO}/rules/")
    )
    routes = (REPO / "routes" / "ubl-2.1.yaml").read_text()
    routes = routes.replace("destination: queue://despatch.inbound", "destination: despatch")
    routes = routes.replace(
        "TotalAmount: {xpath: cac:LegalMonetaryTotal/cbc:PayableAmount, type: double}",
        "TotalAmount: {xpath: cac:LegalMonetaryTotal/cbc:Payable, type: double}",
    )
    routes = routes.replace(
        'partners: [globex]\n    root: "{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}',
        'partners: [globex, initech]\n    root: "{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}',
    )
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


def test_key_new_prints_a_key_and_its_hash(capsys, store):
    from gateway.cli.store_secret import store_secret
    from gateway.security.keys import verify_hmac

    code, out, _ = run(capsys, "key", "new", "--id", "initech-1")
    assert code == 0
    key = out.split("): ")[1].split()[0]
    encoded = out.split('hash: "')[1].split('"')[0]
    assert key.startswith("initech-1.") and encoded.startswith("hmac-sha256$")
    secret = store_secret(store)  # the store's server secret, made by the command
    assert verify_hmac(secret, key, encoded) and not verify_hmac(secret, key + "x", encoded)
    assert "choose another --id" in user_error(run(capsys, "key", "new", "--id", "bad id"))


def test_db_upgrade(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'up.db'}"
    code, out, _ = run(capsys, "db", "upgrade", "--url", url)
    broker_head = _broker_head_revision()  # the broker's own chain moves with the broker
    from gateway.ledger.records import head_revision

    assert code == 0 and f"broker tables at revision {broker_head}, ledger tables at revision {head_revision()}" in out


def _broker_head_revision() -> str:
    from broker_core.sql import MIGRATIONS, head_revision

    return head_revision(MIGRATIONS)


def test_send_queues_browse_and_dlq_replay(capsys, store, shared_schemas):
    code, out, err = run(
        capsys,
        "send",
        str(UBL_EXAMPLES / "UBL-Invoice-2.1-Example.xml"),
        "--partner",
        "globex",
        "--correlation-id",
        "cli-1",
    )
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
    ledger = Ledger(broker.engine)
    broker.close()
    code, out, _ = run(capsys, "queues")
    row = next(line for line in out.splitlines() if line.startswith("queue://invoices.inbound"))
    assert row.split()[1:4] == ["0", "0", "1"]

    code, out, _ = run(capsys, "dlq", "replay", "queue://invoices.inbound")
    assert code == 0 and out.startswith("moved 1 message from queue://DLQ.invoices.inbound")
    assert ledger.get(receipt["message_id"]).status == "accepted"
    code, out, _ = run(capsys, "browse", "queue://invoices.inbound", "--selector", "InvoiceID = 'TOSL108'")
    assert "1 message in" in out
    assert "only queues can be browsed" in user_error(run(capsys, "browse", "topic://x"))
    # what the commands did is in the audit trail, under the system user, like the console's actions
    from gateway.admin.audit import Audit

    broker = Broker.open(store, sweep_interval=0)
    try:
        entries = Audit(broker.engine, broker).recent(limit=10)
    finally:
        broker.close()
    assert [e.action for e in entries][:2] == ["browse", "replay"]
    replay = entries[1]
    assert replay.role == "cli" and replay.target == "queue://DLQ.invoices.inbound" and replay.count == 1
    assert replay.message_ids == [receipt["message_id"]] and replay.client.startswith("cli@")


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
    line = user_error(run(capsys, "worker", "--config", str(tmp_path / "w.yaml")))
    assert "no 'workers:'" in line and "gateway.samples.order_responder" in line


def test_configuration_errors_are_user_errors(capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("server:\n  port: eighty\n")
    line = user_error(run(capsys, "routes", "check", "--config", str(tmp_path / "bad.yaml")))
    assert f"{tmp_path / 'bad.yaml'}:2" in line
    (tmp_path / "bad.yaml").write_text("store:\n  options:\n    local_wakeups: 'off'\n")
    line = user_error(run(capsys, "routes", "check", "--config", str(tmp_path / "bad.yaml")))
    assert f"{tmp_path / 'bad.yaml'}:3: store.options: option local_wakeups must be true or false" in line
    line = user_error(run(capsys, "routes", "check", "--config", str(tmp_path)))  # a directory
    assert str(tmp_path) in line and "Errno" not in line


# --------------------------------------------------------------------------- the newcomer's rough edges


def test_version_is_the_installed_package_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out == f"b2bgw {importlib.metadata.version('b2bgw')}\n"


#: Every command that reads the configuration, with arguments that get it as far as reading it.
CONFIG_COMMANDS = [
    ["serve"],
    ["stomp"],
    ["worker"],
    ["send", "DOC", "--partner", "acme"],
    ["queues"],
    ["browse", "orders.inbound"],
    ["dlq", "replay", "orders.inbound"],
    ["db", "upgrade"],
    ["routes", "check"],
    ["key", "new", "--id", "k1"],
]


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_configuration_command_takes_c_before_or_after_it(capsys, tmp_path, monkeypatch, command):
    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    monkeypatch.delenv("B2BGW_STORE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "doc.xml").write_bytes(b"<Order/>")
    argv = [str(tmp_path / "doc.xml") if word == "DOC" else word for word in command]
    missing = str(tmp_path / "missing.yaml")
    for given in (
        argv + ["-c", missing],
        ["-c", missing] + argv,
        argv + ["--config", missing],
        ["--config", missing] + argv,
    ):
        assert f"-c {missing}: no such file" in user_error(run(capsys, *given)), given
    # the same default for all of them: nothing in the current directory, no $B2BGW_CONFIG: said, not guessed
    line = user_error(run(capsys, *argv))
    assert "no configuration file" in line and "./config/b2bgw.yaml" in line and "./b2bgw.yaml" in line


def test_the_configuration_search_order(capsys, tmp_path, monkeypatch):
    from gateway.config.loader import default_config_path

    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_config_path() is None
    minimal = "store: {url: 'sqlite:///" + str(tmp_path / "s.db") + "'}\n"
    (tmp_path / "b2bgw.yaml").write_text(minimal)
    assert default_config_path() == Path("b2bgw.yaml")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "b2bgw.yaml").write_text(minimal)
    assert default_config_path() == Path("config/b2bgw.yaml")
    code, out, err = run(capsys, "routes", "check")
    assert code == 0 and out.startswith("config/b2bgw.yaml: OK: 0 partners, 0 routes, 0 schemas"), err
    (tmp_path / "elsewhere.yaml").write_text(minimal)
    monkeypatch.setenv("B2BGW_CONFIG", str(tmp_path / "elsewhere.yaml"))
    assert default_config_path() == tmp_path / "elsewhere.yaml"
    code, out, _ = run(capsys, "routes", "check")
    assert code == 0 and out.startswith(f"{tmp_path / 'elsewhere.yaml'}: OK")
    code, out, _ = run(capsys, "-c", "b2bgw.yaml", "routes", "check")  # -c before all of them
    assert code == 0 and out.startswith("b2bgw.yaml: OK")
    monkeypatch.setenv("B2BGW_CONFIG", str(tmp_path / "gone.yaml"))
    assert f"$B2BGW_CONFIG={tmp_path / 'gone.yaml'}: no such file" in user_error(run(capsys, "routes", "check"))


@pytest.fixture
def no_uvicorn(monkeypatch) -> dict:
    """uvicorn.run recorded instead of run: what serve would have served."""
    import uvicorn

    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: seen.update(app=app, **kwargs))
    return seen


def test_serve_outside_a_deployment_says_where_it_looked(capsys, tmp_path, monkeypatch, no_uvicorn):
    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    line = user_error(run(capsys, "serve"))
    assert str(tmp_path) in line and "-c FILE" in line and "$B2BGW_CONFIG" in line
    assert not no_uvicorn  # the sample configuration of the source tree is not served


def test_serve_from_the_checkout_with_no_arguments_names_its_configuration(
    capsys, caplog, tmp_path, monkeypatch, no_uvicorn, shared_schemas
):
    # what scripts/serve does: `b2bgw serve` in the checkout, no -c, no $B2BGW_CONFIG
    monkeypatch.delenv("B2BGW_CONFIG", raising=False)
    monkeypatch.setenv("B2BGW_STORE_URL", f"sqlite:///{tmp_path / 'serve.db'}")
    monkeypatch.chdir(REPO)
    caplog.set_level(logging.INFO, logger="gateway.cli")
    code, _, err = run(capsys, "serve", "--port", "0", "--no-etl", "--no-stomp")
    assert code == 0, err
    assert no_uvicorn["host"] == "127.0.0.1"
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    assert f"configuration {SAMPLE_CONFIG}" in line and SAMPLE_CONFIG.is_absolute()


def test_serve_with_a_store_it_cannot_open_says_so_without_its_password(capsys, monkeypatch):
    monkeypatch.setenv("B2BGW_STORE_URL", "postgresql+psycopg://gw:s3cret@127.0.0.1:1/gw")
    line = user_error(run(capsys, "-c", str(SAMPLE_CONFIG), "serve", "--port", "0"))
    assert "cannot open the store" in line and "s3cret" not in line and "***" in line and "store.url" in line


def test_serve_refuses_a_public_address_while_the_demo_keys_are_configured(capsys, store, no_uvicorn):
    for host in ("0.0.0.0", "::", "192.0.2.10"):
        line = user_error(run(capsys, "serve", "--host", host, "--port", "0"))
        assert f"refusing to listen on {host}" in line and "acme-demo" in line and "globex-demo" in line
        assert "b2bgw key new" in line and str(SAMPLE_CONFIG) in line
    assert not no_uvicorn


def test_serve_listens_on_a_public_address_with_keys_of_its_own(capsys, tmp_path, no_uvicorn):
    from gateway.routing.partners import generate_key, hash_key

    own = generate_key("acme-demo")  # the demo's key id, a new secret: not the published key
    config = tmp_path / "b2bgw.yaml"
    config.write_text(
        "store: {url: 'sqlite:///" + str(tmp_path / "p.db") + "'}\n"
        "partners:\n"
        "  acme:\n    keys:\n      - {id: acme-demo, hash: '" + hash_key(own) + "'}\n"
        "  globex:\n    enabled: false\n"  # the published key of a disabled partner lets nobody in
        "    keys:\n      - {id: globex-demo, hash: '" + _published_hash("globex-demo") + "'}\n"
        "etl: {enabled: false}\nstomp: {enabled: false}\n"
    )
    code, _, err = run(capsys, "serve", "-c", str(config), "--host", "0.0.0.0", "--port", "0")
    assert code == 0, err
    assert no_uvicorn["host"] == "0.0.0.0"


def _published_hash(key_id: str) -> str:
    from gateway.config.loader import load_yaml

    partners = load_yaml(REPO / "config" / "partners.yaml")["partners"]
    return next(k["hash"] for p in partners.values() for k in p["keys"] if k["id"] == key_id)


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.1.2.3", False),
        ("gateway.example.com", False),
    ],
)
def test_which_addresses_are_loopback(host, loopback):
    assert serve_cli.is_loopback(host) is loopback


def _taken_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_serve_user_errors(capsys, tmp_path, store, no_uvicorn):
    sock, port = _taken_port()
    with sock:
        line = user_error(run(capsys, "serve", "--port", str(port)))
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line
    assert "argument --port" in user_error(run(capsys, "serve", "--port", "65536"))
    assert "argument --port" in user_error(run(capsys, "serve", "--port", "eighty"))
    assert "argument --processes" in user_error(run(capsys, "serve", "--processes", "-1"))
    config = tmp_path / "w.yaml"
    config.write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {REPO}/config/partners.yaml")
        .replace("routes: ../routes/ubl-2.1.yaml", f"routes: {REPO}/routes/ubl-2.1.yaml")
        .replace("gateway.samples.order_responder", "gateway.samples.no_such_module")
    )
    for processes in ("1", "2"):  # found before any serving process starts
        line = user_error(run(capsys, "serve", "-c", str(config), "--port", "0", "--processes", processes))
        assert "gateway.samples.no_such_module" in line and "cannot be imported" in line
    assert not no_uvicorn


def test_stomp_user_errors(capsys, tmp_path, store):
    sock, port = _taken_port()
    with sock:
        line = user_error(run(capsys, "stomp", "--port", str(port)))
    assert f"cannot listen on 127.0.0.1:{port}" in line
    config = tmp_path / "s.yaml"
    config.write_text("store: {url: 'sqlite:///" + str(tmp_path / "s.db") + "'}\nstomp: {enabled: false}\n")
    assert "stomp.enabled: false" in user_error(run(capsys, "stomp", "-c", str(config)))


def test_browse_and_dlq_user_errors(capsys, store):
    for queue in ("orders.inbound", "Q"):  # the selector is checked first, whatever the queue
        line = user_error(run(capsys, "browse", queue, "--selector", "amount >> 3"))
        assert line.startswith("b2bgw browse: --selector 'amount >> 3'") and "column 9" in line and "e.g." in line
    line = user_error(run(capsys, "browse", "orders.inbound", "--selector", "Amount > 'x'"))
    assert "--selector" in line and "strings" in line
    line = user_error(run(capsys, "browse", "ordres.inbound"))  # a typo
    assert "no queue queue://ordres.inbound is known" in line and "queue://orders.inbound" in line
    assert "queue://NAME" in user_error(run(capsys, "browse", "queue://"))
    assert "argument --limit" in user_error(run(capsys, "browse", "orders.inbound", "--limit", "0"))
    code, out, _ = run(capsys, "browse", "orders.inbound")  # routed to, empty: known
    assert code == 0 and "0 messages in queue://orders.inbound" in out
    assert "no queue queue://ordres.inbound" in user_error(run(capsys, "dlq", "replay", "ordres.inbound"))
    assert "only queues" in user_error(run(capsys, "dlq", "replay", "topic://prices"))
    assert "choose an action: replay" in user_error(run(capsys, "dlq"))


def test_send_user_errors(capsys, tmp_path, store, monkeypatch):
    monkeypatch.delenv("B2BGW_API_KEY", raising=False)
    document = str(UBL_EXAMPLES / "UBL-Invoice-2.1-Example.xml")
    line = user_error(run(capsys, "send", str(tmp_path / "nothing.xml"), "--partner", "globex"))
    assert str(tmp_path / "nothing.xml") in line and "No such file" in line
    assert "send needs --partner" in user_error(run(capsys, "send", document))
    line = user_error(run(capsys, "send", document, "--partner", "initech"))
    assert "no partner 'initech'" in line and "acme, globex" in line
    assert "--key" in user_error(run(capsys, "send", document, "--url", "http://127.0.0.1:8080"))
    for url in ("127.0.0.1:8080", "ftp://127.0.0.1/", "http://"):
        assert "is not a gateway URL" in user_error(run(capsys, "send", document, "--url", url, "--key", "k.x"))
    url = f"http://127.0.0.1:{_free_port()}"
    line = user_error(run(capsys, "send", document, "--url", url, "--key", "k.x"))
    assert f"cannot reach {url}/v1/documents" in line and "b2bgw serve" in line
    assert "argument --timeout" in user_error(run(capsys, "send", document, "--url", url, "--timeout", "0"))


def test_store_user_errors(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("B2BGW_CONFIG", str(SAMPLE_CONFIG))
    monkeypatch.setenv("B2BGW_STORE_URL", "postgresql+psycopg://gw:s3cret@127.0.0.1:1/gw")
    for command in (["queues"], ["browse", "orders.inbound"], ["dlq", "replay", "orders.inbound"]):
        line = user_error(run(capsys, *command))
        assert "cannot open the store" in line and "s3cret" not in line and "database is running" in line
    monkeypatch.setenv("B2BGW_STORE_URL", "sqlite:/no-slashes")
    assert "sqlite:///PATH" in user_error(run(capsys, "queues"))
    line = user_error(run(capsys, "db", "upgrade", "--url", "postgresql+psycopg://gw:s3cret@127.0.0.1:1/gw"))
    assert "cannot use the database" in line and "s3cret" not in line
    assert "only SQL stores" in user_error(run(capsys, "db", "upgrade", "--url", "memory://"))


def test_usage_errors_are_one_line(capsys):
    line = user_error(run(capsys, "serve", "--no-such-option"))
    assert "--no-such-option" in line and "b2bgw serve --help" in line
    assert "invalid choice: 'sreve'" in user_error(run(capsys, "sreve"))
    assert "invalid choice" in user_error(run(capsys, "--log-level", "loud", "queues"))
    assert "choose an action" in user_error(run(capsys, "routes"))


def test_an_unexpected_failure_keeps_its_traceback(capsys, monkeypatch):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(queue_cli, "cmd_queues", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["queues"])


def _config_with_stomp(tmp_path, stomp: str) -> str:
    from gateway.routing.partners import generate_key, hash_key

    config = tmp_path / "b2bgw.yaml"
    config.write_text(
        "store: {url: 'sqlite:///" + str(tmp_path / "s.db") + "'}\n"
        "partners:\n  acme:\n    keys:\n      - {id: acme-own, hash: '" + hash_key(generate_key("acme-own")) + "'}\n"
        "etl: {enabled: false}\nstomp: " + stomp + "\n"
    )
    return str(config)


def test_serve_and_stomp_refuse_a_stomp_listener_without_users_on_any_address(capsys, tmp_path, no_uvicorn):
    for host in ("127.0.0.1", "0.0.0.0"):
        config = _config_with_stomp(tmp_path, "{host: " + host + ", port: 0}")
        for argv in (
            ("serve", "-c", config, "--port", "0"),
            ("stomp", "-c", config, "--port", "0"),
            ("stomp", "-c", config, "--host", "0.0.0.0", "--port", "0"),
        ):
            line = user_error(run(capsys, *argv))
            assert "needs stomp.users" in line and "passcode_file" in line and "stomp.enabled: false" in line, line
    assert not no_uvicorn


def test_serve_starts_a_stomp_listener_with_users_or_without_stomp(capsys, tmp_path, no_uvicorn):
    public = _config_with_stomp(tmp_path, "{host: 0.0.0.0, port: 0}")
    code, _, err = run(capsys, "serve", "-c", public, "--port", "0", "--no-stomp")
    assert code == 0, err
    checked = _config_with_stomp(
        tmp_path,
        "{host: 0.0.0.0, port: 0, users: {backend: {passcode_file: backend.pass, consume: [/queue/orders.inbound]}}}",
    )
    code, _, err = run(capsys, "serve", "-c", checked, "--port", "0")
    assert code == 0, err
    assert no_uvicorn
    secret = tmp_path / "backend.pass"  # generated on first run, for the operator only; the listener keeps its hash
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_text().strip()) >= 40
    from broker_core.stomp import verify_passcode

    assert verify_passcode(secret.read_text().strip(), (tmp_path / "backend.pass.hash").read_text().strip())


def test_stomp_hash_passcode_prints_a_hash_the_listener_takes(monkeypatch, capsys):
    import io

    from broker_core.stomp import verify_passcode

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret passcode\n"))
    code, out, _ = run(capsys, "stomp", "--hash-passcode")
    assert code == 0 and verify_passcode("s3cret passcode", out.strip())


def test_a_serving_process_given_its_socket_refuses_a_stomp_listener_without_users(capsys, tmp_path, monkeypatch):
    """``serve --listen-fd`` (a supervisor's serving process) runs the same refusal before serving."""
    import socket

    import uvicorn

    served = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(sockets))
    config = _config_with_stomp(tmp_path, "{host: 0.0.0.0, port: 0}")
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen()
        line = user_error(run(capsys, "serve", "-c", config, "--listen-fd", str(sock.fileno()), "--process-index", "0"))
    assert "needs stomp.users" in line and not served
