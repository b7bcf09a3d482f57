"""Business rules at intake: the HTTP contract, the time budget, the configuration and `b2bgw rules check`.

One gateway serves the module: the sample configuration with its Order rules (rules/ubl-order.sch)
on a one-way Order route and a request-reply one, plus a test rule set whose rules refuse an order
on every element, run too long, or fail on a value, depending on the order's note.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from gwtest import ACME, FIXTURES, ORDER, REPO, SAMPLE_CONFIG, UBL_EXAMPLES, Responder, sample_data, with_id

from broker_core import Queue
from gateway.cli.main import main
from gateway.config.loader import settings_from_mapping
from gateway.errors import ConfigError, RulesEvaluationError
from gateway.exchange.assemble import assemble, assemble_or_raise
from gateway.http.app import create_app
from gateway.rules.rulesets import WALL_FACTOR, RuleBook, RuleSet, RulesRunner
from gateway.rules.schematron import load_schematron
from gateway.runtime.serving import Runtime

BUDGET = 1.0

TEST_RULES = """\
<sch:schema xmlns:sch="http://purl.oclc.org/dsdl/schematron" queryBinding="xslt2">
  <sch:ns prefix="ubl" uri="urn:oasis:names:specification:ubl:schema:xsd:Order-2"/>
  <sch:ns prefix="cbc" uri="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"/>
  <sch:ns prefix="xs" uri="http://www.w3.org/2001/XMLSchema"/>
  <sch:pattern>
    <sch:rule context="/ubl:Order[cbc:Note = 'many']//*">
      <sch:report id="EVERY" flag="error" test="true()">element <sch:name/></sch:report>
    </sch:rule>
  </sch:pattern>
  <sch:pattern>
    <sch:rule context="/ubl:Order[cbc:Note = 'slow']">
      <sch:assert id="SLOW" test="sum(for $i in 1 to 2000000000 return $i mod 7) ge 0">slow</sch:assert>
    </sch:rule>
  </sch:pattern>
  <sch:pattern>
    <sch:rule context="/ubl:Order[cbc:Note = 'error']">
      <sch:assert id="CAST" test="xs:integer(cbc:Note) gt 0">cast</sch:assert>
    </sch:rule>
  </sch:pattern>
</sch:schema>
"""


@pytest.fixture
def shared_schemas(gw_registry, monkeypatch) -> None:
    """Commands on the sample schemas reuse the session's compiled registry."""
    import gateway.exchange.assemble

    monkeypatch.setattr(gateway.exchange.assemble, "build_registry", lambda settings, errors: gw_registry)


def noted(note: str, order_id: str) -> bytes:
    return with_id(ORDER, order_id).replace(
        b"<cbc:Note>Information text for the whole order</cbc:Note>", f"<cbc:Note>{note}</cbc:Note>".encode()
    )


@pytest.fixture(scope="module")
def env(tmp_path_factory, gw_registry):
    tmp = tmp_path_factory.mktemp("rules-http")
    (tmp / "test-rules.sch").write_text(TEST_RULES)
    data = sample_data(tmp, business_rules=True)
    data["rules"]["sets"]["test"] = {"file": str(tmp / "test-rules.sch")}
    data["rules"]["workers"] = 1
    data["limits"]["rules_seconds"] = BUDGET
    order = data["routes"][0]
    assert order["id"] == "ubl-order"
    order["rules"] = ["ubl-order", "test"]
    order["when"] = "cbc:Note = 'reply'"
    one_way = {k: v for k, v in order.items() if k not in ("exchange", "timeout", "when")}
    one_way.update(id="ubl-order-one-way", destination="queue://orders.checked")
    data["routes"].insert(1, one_way)
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp)
    assembly = assemble(settings, registry=gw_registry)
    assert not assembly.errors, assembly.errors
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    responder = Responder(runtime.broker).start()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient
    client = TestClient(create_app(assembly, runtime=runtime), raise_server_exceptions=True)
    try:
        yield client, runtime, responder
    finally:
        client.close()
        responder.stop()
        runtime.stop()


def post(env, document: bytes) -> Any:
    client, _, _ = env
    return client.post("/v1/documents", content=document, headers=ACME)


def problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == code and body["type"] == f"urn:b2bgw:problem:{code}"
    return body


def checked(env) -> list[Any]:
    _, runtime, _ = env
    return list(runtime.broker.browse(Queue("orders.checked")))


GLN_WARNINGS = [
    "/ubl:Order[1]/cac:BuyerCustomerParty[1]/cac:Party[1]/cbc:EndpointID[1]",
    "/ubl:Order[1]/cac:SellerSupplierParty[1]/cac:Party[1]/cbc:EndpointID[1]",
    "/ubl:Order[1]/cac:OriginatorCustomerParty[1]/cac:Party[1]/cac:PartyIdentification[1]/cbc:ID[1]",
    "/ubl:Order[1]/cac:Delivery[1]/cac:DeliveryParty[1]/cac:PartyIdentification[1]/cbc:ID[1]",
]


# --------------------------------------------------------------------------- accepted, with warnings


def test_the_official_example_is_accepted_with_its_warnings_on_202(env):
    before = len(checked(env))
    response = post(env, with_id(ORDER, "rules-202"))
    assert response.status_code == 202, response.text
    receipt = response.json()
    assert [(w["id"], w["flag"], w["location"]) for w in receipt["warnings"]] == [
        ("PTY-02", "warning", location) for location in GLN_WARNINGS
    ]
    assert "7300072311115" in receipt["warnings"][0]["text"]
    # the ledger keeps them: GET shows them
    client, _, _ = env
    status = client.get(receipt["status_url"], headers=ACME).json()
    assert status["warnings"] == receipt["warnings"]
    # the message carries their count
    messages = checked(env)
    assert len(messages) == before + 1
    assert messages[-1].get_int_property("B2BRuleWarnings") == 4


def test_request_reply_answers_200_and_records_the_warnings(env):
    response = post(env, noted("reply", "rules-200"))
    assert response.status_code == 200, response.text
    assert b"OrderResponse" in response.content
    client, _, responder = env
    status = client.get(response.headers["content-location"], headers=ACME).json()
    assert [w["id"] for w in status["warnings"]] == ["PTY-02"] * 4
    assert responder.seen[-1].get_int_property("B2BRuleWarnings") == 4


def test_an_order_without_warnings_has_none_in_its_receipt(env):
    clean = with_id(ORDER, "rules-clean")
    for gln in (b"7300072311115", b"7302347231111", b"0987678321123", b"67654328394567"):
        clean = clean.replace(gln, b"7300070011115")
    response = post(env, clean)
    assert response.status_code == 202, response.text
    assert "warnings" not in response.json()
    assert checked(env)[-1].get_int_property("B2BRuleWarnings") == 0


def test_an_order_with_tax_is_accepted(env):
    """The payable amount of an order that states its tax includes it: lines 115.00 EUR, 25% VAT, payable
    143.75 (as in Peppol BIS 3's order example)."""
    before = len(checked(env))
    response = post(env, (FIXTURES / "UBL-Order-2.1-With-Tax.xml").read_bytes())
    assert response.status_code == 202, response.text
    assert "warnings" not in response.json()
    assert len(checked(env)) == before + 1


# --------------------------------------------------------------------------- refused: 400


def test_an_order_breaking_the_rules_is_refused_with_every_failure(env):
    before = len(checked(env))
    bad = (
        with_id(ORDER, "rules-400")
        .replace(b'currencyID="SEK">225<', b'currencyID="SEK">226<')
        .replace(b"<cbc:ID>2</cbc:ID>", b"<cbc:ID>1</cbc:ID>")
    )
    body = problem(post(env, bad), 400, "business-rule-violation")
    got = [(e["id"], e["flag"], e["location"]) for e in body["errors"]]
    assert got == [
        ("TOT-01", "fatal", "/ubl:Order[1]/cac:AnticipatedMonetaryTotal[1]"),
        ("LIN-02", "fatal", "/ubl:Order[1]/cac:OrderLine[1]/cac:LineItem[1]"),
        ("LIN-02", "fatal", "/ubl:Order[1]/cac:OrderLine[2]/cac:LineItem[1]"),
        ("LIN-06", "fatal", "/ubl:Order[1]/cac:OrderLine[2]/cac:LineItem[1]/cbc:LineExtensionAmount[1]"),
    ]
    assert "TOT-01" in body["detail"] and "4 business rules" in body["detail"]
    lines = bad.decode().splitlines()
    for error, tag in zip(
        body["errors"],
        ("<cac:AnticipatedMonetaryTotal>", "<cac:LineItem>", "<cac:LineItem>", "<cbc:LineExtensionAmount"),
        strict=False,
    ):
        assert lines[error["line"] - 1][error["column"] - 1 :].startswith(tag), error
    assert len(checked(env)) == before  # nothing accepted


def test_a_large_order_is_checked_by_the_rules_too(env):
    """Bodies over the size validated on their tree are validated while they are parsed: the rules still run."""
    from gateway.exchange.stages import TREE_VALIDATION_MAX_BYTES

    padding = b"<!--" + b" " * TREE_VALIDATION_MAX_BYTES + b"-->"
    small = with_id(ORDER, "rules-400-small").replace(b'currencyID="SEK">225<', b'currencyID="SEK">226<')
    large = small.replace(b"<cbc:ID>rules-400-small</cbc:ID>", b"<cbc:ID>rules-400-large</cbc:ID>" + padding)
    assert len(small) <= TREE_VALIDATION_MAX_BYTES < len(large)
    found = problem(post(env, small), 400, "business-rule-violation")["errors"]
    assert "TOT-01" in [e["id"] for e in found]
    body = problem(post(env, large), 400, "business-rule-violation")
    assert [(e["id"], e["location"]) for e in body["errors"]] == [(e["id"], e["location"]) for e in found]


def test_at_most_50_failures_are_listed(env):
    body = problem(post(env, noted("many", "rules-many")), 400, "business-rule-violation")
    assert len(body["errors"]) == 50
    assert body["omitted_errors"] > 100
    assert all(e["id"] == "EVERY" and e["flag"] == "error" and e["line"] for e in body["errors"])


# --------------------------------------------------------------------------- the time budget and rule errors


def test_a_document_over_the_time_budget_gets_422_and_costs_no_more(env):
    _, runtime, _ = env
    started = time.monotonic()
    body = problem(post(env, noted("slow", "rules-slow")), 422, "rules-timeout")
    elapsed = time.monotonic() - started
    assert f"{BUDGET:g} s" in body["detail"]
    assert elapsed < BUDGET + 3.0  # the budget, a process to stop: not the whole computation
    assert runtime.gateway.rules.timeouts >= 1
    # the stopped worker was replaced: the next document is checked as usual
    assert post(env, with_id(ORDER, "rules-after-slow")).status_code == 202


def test_a_rule_failing_on_a_value_gets_422(env):
    body = problem(post(env, noted("error", "rules-error")), 422, "rules-error")
    assert "FORG0001" in body["detail"] or "convert" in body["detail"].lower()
    assert post(env, with_id(ORDER, "rules-after-error")).status_code == 202


def test_a_worker_that_died_is_replaced(env):
    _, runtime, _ = env
    runner = runtime.gateway.rules
    (worker,) = runner._workers
    worker.process.kill()
    worker.process.wait()
    response = post(env, with_id(ORDER, "rules-after-kill"))
    assert response.status_code == 202, response.text
    assert len(response.json()["warnings"]) == 4


def _ready_worker(runner: RulesRunner) -> Any:
    (worker,) = runner._workers
    deadline = time.monotonic() + 60
    while not worker.ready:  # a worker stopped by an earlier test is being replaced
        assert time.monotonic() < deadline, "the rules worker did not come back"
        time.sleep(0.05)
    return worker


def test_a_document_whose_worker_is_starved_is_checked_all_the_same(env):
    """The budget is processor time: a worker that gets none for twice the budget (the machine busy with
    other work; here, stopped) still checks an honest document, which is accepted."""
    _, runtime, _ = env
    runner = runtime.gateway.rules
    worker = _ready_worker(runner)
    pid, extended, timeouts = worker.process.pid, runner.extended, runner.timeouts
    os.kill(pid, signal.SIGSTOP)
    resume = threading.Timer(BUDGET * 2, os.kill, (pid, signal.SIGCONT))
    resume.start()
    started = time.monotonic()
    try:
        response = post(env, with_id(ORDER, "rules-starved"))
    finally:
        resume.join()
    assert time.monotonic() - started >= BUDGET * 2
    assert response.status_code == 202, response.text
    assert len(response.json()["warnings"]) == 4  # the sample rules did run
    assert (runner.extended, runner.timeouts) == (extended + 1, timeouts)
    assert worker.process is not None and worker.process.pid == pid  # not stopped


def test_a_document_whose_worker_gets_no_processor_time_gets_503_and_may_be_sent_again(env):
    """At WALL_FACTOR times the budget the document is answered 503 gateway-busy with Retry-After: the load is
    the cause, not the document, and nothing was accepted, so the same document is accepted when sent
    again."""
    _, runtime, _ = env
    runner = runtime.gateway.rules
    worker = _ready_worker(runner)
    overloads, timeouts = runner.overloads, runner.timeouts
    os.kill(worker.process.pid, signal.SIGSTOP)
    document = with_id(ORDER, "rules-overloaded")
    started = time.monotonic()
    response = post(env, document)
    elapsed = time.monotonic() - started
    body = problem(response, 503, "gateway-busy")
    assert body["retry_after"] >= 1 and response.headers["retry-after"] == str(body["retry_after"])
    assert "nothing was accepted" in body["detail"]
    assert BUDGET * WALL_FACTOR <= elapsed < BUDGET * WALL_FACTOR + 3.0
    assert (runner.overloads, runner.timeouts) == (overloads + 1, timeouts)
    again = post(env, document)  # the stopped worker was replaced
    assert again.status_code == 202, again.text
    assert "idempotent-replayed" not in again.headers


def test_rules_run_from_the_intake_threads_too(tmp_path, gw_registry):
    data = sample_data(tmp_path, business_rules=True)
    data["server"]["intake_threads"] = 1
    data["rules"]["workers"] = 1
    order = data["routes"][0]
    order.update(exchange="one-way", destination="queue://orders.threads")
    del order["timeout"]
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)
    assembly = assemble(settings, registry=gw_registry)
    assert not assembly.errors, assembly.errors
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        assert runtime.gateway._intake_pool is not None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from starlette.testclient import TestClient
        with TestClient(create_app(assembly, runtime=runtime)) as client:
            accepted = client.post("/v1/documents", content=with_id(ORDER, "threads-ok"), headers=ACME)
            refused = client.post(
                "/v1/documents",
                content=with_id(ORDER, "threads-bad").replace(b"<cbc:ID>2</cbc:ID>", b"<cbc:ID>1</cbc:ID>"),
                headers=ACME,
            )
        assert accepted.status_code == 202 and len(accepted.json()["warnings"]) == 4
        body = problem(refused, 400, "business-rule-violation")
        assert {e["id"] for e in body["errors"]} == {"LIN-02"}
    finally:
        runtime.stop()


def test_a_document_that_needs_too_much_memory_stops_its_worker_only(tmp_path):
    (tmp_path / "memory.sch").write_text(
        textwrap.dedent("""\
        <sch:schema xmlns:sch="http://purl.oclc.org/dsdl/schematron" queryBinding="xslt2">
          <sch:pattern><sch:rule context="/*[@n]">
            <sch:assert id="BIG" test="string-length(string-join(for $i in 1 to xs:integer(@n) return
              string(current-dateTime()) || $i, '')) gt 0" xmlns:xs="http://www.w3.org/2001/XMLSchema">big</sch:assert>
          </sch:rule></sch:pattern>
        </sch:schema>""")
    )
    book = RuleBook({"memory": RuleSet("memory", load_schematron(tmp_path / "memory.sch"))})
    runner = RulesRunner(book, workers=1, seconds=60, memory_mb=256)
    runner.start()
    try:
        assert runner.check(["memory"], '<a n="10"/>') == []
        with pytest.raises(RulesEvaluationError, match="256 MB"):
            runner.check(["memory"], '<a n="50000000"/>')
        assert runner.check(["memory"], '<a n="10"/>') == []  # a new worker took its place
    finally:
        runner.stop()


# --------------------------------------------------------------------------- configuration errors


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def config_with(tmp_path: Path, rules_file: str, route_rules: str = "[ubl-order]") -> Path:
    routes = (REPO / "routes" / "ubl-2.1.yaml").read_text().replace("rules: [ubl-order]", f"rules: {route_rules}")
    (tmp_path / "routes.yaml").write_text(routes)
    config = (
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {REPO}/config/partners.yaml")
        .replace("routes: ../routes/ubl-2.1.yaml", "routes: routes.yaml")
        .replace("file: ../rules/ubl-order.sch", f"file: {rules_file}")
        .replace("url: sqlite:///var/b2bgw.db", f"url: sqlite:///{tmp_path}/gw.db")
    )
    (tmp_path / "b2bgw.yaml").write_text(config)
    return tmp_path / "b2bgw.yaml"


BROKEN = """\
<sch:schema xmlns:sch="http://purl.oclc.org/dsdl/schematron" queryBinding="xslt2">
  <sch:pattern>
    <sch:rule context="*">
      <sch:assert test="count(*) >">broken XPath</sch:assert>
    </sch:rule>
  </sch:pattern>
  <sch:include href="missing.sch"/>
</sch:schema>
"""


def test_routes_check_reports_a_bad_rule_file_at_its_line(capsys, tmp_path, shared_schemas):
    (tmp_path / "broken.sch").write_text(BROKEN)
    config = config_with(tmp_path, "broken.sch")
    code, _, err = run_cli(capsys, "routes", "check", "--config", str(config))
    assert code == 1
    assert f"{tmp_path}/broken.sch:7: rule set 'ubl-order': sch:include 'missing.sch': no such file" in err, err
    (tmp_path / "broken.sch").write_text(BROKEN.replace('  <sch:include href="missing.sch"/>\n', ""))
    code, _, err = run_cli(capsys, "routes", "check", "--config", str(config))
    assert code == 1
    assert f"{tmp_path}/broken.sch:4: rule set 'ubl-order': XPath does not compile: XPST0003" in err, err


def test_routes_check_reports_a_file_that_is_not_schematron_and_an_unknown_rule_set(capsys, tmp_path, shared_schemas):
    (tmp_path / "not.sch").write_text("<rules>\n</rules>\n")
    config = config_with(tmp_path, "not.sch", route_rules="[ubl-order, nope]")
    code, _, err = run_cli(capsys, "routes", "check", "--config", str(config))
    assert code == 1
    assert f"{tmp_path}/not.sch:1: rule set 'ubl-order': not an ISO Schematron schema" in err, err
    routes = (tmp_path / "routes.yaml").read_text().splitlines()
    line = next(i for i, text in enumerate(routes, 1) if "rules: [ubl-order, nope]" in text)
    assert f"routes.yaml:{line}: route 'ubl-order' names rule set 'nope', which is not configured" in err, err


def test_serve_refuses_a_bad_rule_file(tmp_path, gw_registry):
    (tmp_path / "broken.sch").write_text(BROKEN)
    data = sample_data(tmp_path, business_rules=True)
    data["rules"]["sets"]["ubl-order"]["file"] = str(tmp_path / "broken.sch")
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)
    with pytest.raises(ConfigError) as caught:  # what create_app(settings), so `b2bgw serve`, calls
        assemble_or_raise(settings, registry=gw_registry)
    assert caught.value.file == str(tmp_path / "broken.sch") and caught.value.line == 7


def test_the_sample_configuration_compiles_its_rules_once(capsys, tmp_path, shared_schemas):
    config = config_with(tmp_path, f"{REPO}/rules/ubl-order.sch")
    code, out, err = run_cli(capsys, "routes", "check", "--config", str(config))
    assert code == 0, err
    assert "rule set ubl-order: 22 assertions" in out
    assert list((tmp_path / "rules-cache").glob("*.json"))  # beside the SQLite store


@pytest.mark.parametrize("value, message", [("0", "more than 0"), ("soon", "duration")])
def test_a_bad_rules_budget_is_refused(tmp_path, value, message):
    data = sample_data(tmp_path, business_rules=True)
    data["limits"]["rules_seconds"] = value
    with pytest.raises(ConfigError, match=message):
        settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)


# --------------------------------------------------------------------------- b2bgw rules check


def test_rules_check_json_lines_and_exit_status(capsys, tmp_path):
    bad = tmp_path / "bad-order.xml"
    bad.write_bytes(ORDER.replace(b"<cbc:ID>2</cbc:ID>", b"<cbc:ID>1</cbc:ID>"))
    good = UBL_EXAMPLES / "UBL-Order-2.1-Example.xml"
    code, out, err = run_cli(
        capsys,
        "rules",
        "check",
        str(REPO / "rules" / "ubl-order.sch"),
        str(good),
        "--json",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert code == 0, err
    (line,) = out.splitlines()
    result = json.loads(line)
    assert result["document"] == str(good) and result["reports"] == []
    assert [set(f) for f in result["failed"]] == [{"id", "flag", "location", "text"}] * 4
    code, out, _ = run_cli(
        capsys,
        "rules",
        "check",
        str(REPO / "rules" / "ubl-order.sch"),
        str(good),
        str(bad),
        "--json",
        "--cache-dir",
        str(tmp_path / "cache"),
    )
    assert code == 1
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["document"] for r in results] == [str(good), str(bad)]
    assert {f["id"] for f in results[1]["failed"]} == {"PTY-02", "LIN-02"}


def test_rules_check_with_a_phase_and_reports(capsys, tmp_path):
    rules = tmp_path / "phased.sch"
    rules.write_text(
        textwrap.dedent("""\
        <sch:schema xmlns:sch="http://purl.oclc.org/dsdl/schematron" queryBinding="xslt2">
          <sch:ns prefix="cbc" uri="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"/>
          <sch:phase id="info"><sch:active pattern="notes"/></sch:phase>
          <sch:pattern id="notes"><sch:rule context="cbc:Note"><sch:report id="NOTE" test="true()">note</sch:report></sch:rule></sch:pattern>
          <sch:pattern id="ids"><sch:rule context="cbc:ID"><sch:assert id="NUM" test=". castable as xs:integer" xmlns:xs="http://www.w3.org/2001/XMLSchema">id</sch:assert></sch:rule></sch:pattern>
        </sch:schema>""")
    )
    order = str(UBL_EXAMPLES / "UBL-Order-2.1-Example.xml")
    code, out, _ = run_cli(capsys, "rules", "check", str(rules), order, "--json", "--phase", "info", "--no-cache")
    assert code == 0
    result = json.loads(out)
    assert result["failed"] == [] and {r["id"] for r in result["reports"]} == {"NOTE"}
    code, out, _ = run_cli(capsys, "rules", "check", str(rules), order, "--no-cache")
    assert code == 1 and "FAILED" in out and "NUM" in out


def test_rules_check_exit_2_for_an_unusable_rule_file(capsys, tmp_path):
    (tmp_path / "broken.sch").write_text(BROKEN)
    code, _, err = run_cli(
        capsys,
        "rules",
        "check",
        str(tmp_path / "broken.sch"),
        str(UBL_EXAMPLES / "UBL-Order-2.1-Example.xml"),
        "--no-cache",
    )
    assert code == 2
    assert f"{tmp_path}/broken.sch:7:" in err
