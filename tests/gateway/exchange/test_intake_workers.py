"""Large documents (over ``inline_max_bytes``) are taken in by worker processes: the partner sees the same
answers, the backend the same messages and the ledger the same rows as when a thread of the serving process
takes them in; a document that outlives its worker is refused and the worker replaced, unless the machine
starved the worker, which is the load's doing; a worker that dies between documents costs nobody an answer;
what a worker says is trusted only as plain data."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest
from gwtest import ACME, GLOBEX, INVOICE, with_id

from gateway.errors import (
    GatewayError,
    NotWellFormedError,
    SchemaValidationError,
    TooManyAttributesError,
    XMLErrorDetail,
)
from gateway.exchange import stages as intake
from gateway.exchange.intake_workers import WORKER_NICE
from gateway.exchange.stages import INLINE_MAX_BYTES
from gateway.helpers.errors import error_from_data, error_to_data

pytestmark = pytest.mark.anyio


def large_invoice(doc_id: str, *, line_extra: bytes = b"") -> bytes:
    """The sample invoice with enough lines to be over INLINE_MAX_BYTES (*line_extra* put into every line)."""
    start = INVOICE.index(b"<cac:InvoiceLine>")
    end = INVOICE.index(b"</cac:InvoiceLine>") + len(b"</cac:InvoiceLine>")
    line = INVOICE[start:end].replace(b"<cac:InvoiceLine>", b"<cac:InvoiceLine>" + line_extra, 1)
    body = with_id(INVOICE[:start] + line * (INLINE_MAX_BYTES // len(line) + 10) + INVOICE[start:], doc_id)
    assert len(body) > INLINE_MAX_BYTES
    return body


async def ready(gateway) -> None:
    workers = gateway.intake_workers
    assert workers is not None
    workers.start()
    deadline = time.monotonic() + 60
    while workers.idle < workers.workers:
        assert time.monotonic() < deadline, "the intake workers did not start"
        await asyncio.sleep(0.05)


def never_in_this_process(monkeypatch) -> list[str]:
    """Record any parse of a document in the serving process."""
    seen: list[str] = []

    def spying(real):
        def spy(*args, **kwargs):
            seen.append(real.__name__)
            return real(*args, **kwargs)

        return spy

    monkeypatch.setattr(intake, "parse_document_text", spying(intake.parse_document_text))
    monkeypatch.setattr(intake, "parse_and_validate", spying(intake.parse_and_validate))
    return seen


def assert_nice_counts(pid: int) -> None:
    """*pid* is scheduled with this process: in its session, so in its autogroup where Linux makes them
    (sched(7): each session's autogroup gets an equal share of the CPUs, whatever its tasks' nice values), and
    in a process group of its own, so that a terminal's ^C goes to the serving process alone."""
    assert os.getsid(pid) == os.getsid(0)
    assert os.getpgid(pid) == pid != os.getpgid(0)
    try:  # "/autogroup-N nice K", or empty where the session is in the kernel's default group: equal when shared
        with open(f"/proc/{pid}/autogroup") as theirs, open("/proc/self/autogroup") as ours:
            assert theirs.read() == ours.read()
    except FileNotFoundError:  # a kernel without autogroups: the session is what matters elsewhere
        pass


def _comparable(answer: dict) -> dict:
    return {
        k: v
        for k, v in answer.items()
        if k not in ("message_id", "received_at", "status_url", "correlation_id", "document_id")
    }


async def test_a_worker_takes_a_large_document_in_as_a_thread_would(gw_env, monkeypatch):
    gateway = gw_env.gateway
    await ready(gateway)
    seen = never_in_this_process(monkeypatch)

    by_worker = await gw_env.client.post("/v1/documents", content=large_invoice("LARGE-W"), headers=GLOBEX)
    assert by_worker.status_code == 202, by_worker.text
    assert seen == [] and gateway.intake_workers.counts["worker"] == 1
    base = os.getpriority(os.PRIO_PROCESS, 0)
    for worker in gateway.intake_workers._all:  # niced: the serving process comes first
        assert os.getpriority(os.PRIO_PROCESS, worker.process.pid) == min(19, base + WORKER_NICE)
        assert_nice_counts(worker.process.pid)

    monkeypatch.setattr(gateway.intake, "intake_workers", None)  # the same document type on a thread, for comparison
    by_thread = await gw_env.client.post("/v1/documents", content=large_invoice("LARGE-T"), headers=GLOBEX)
    assert by_thread.status_code == 202, by_thread.text
    assert seen  # the thread parsed it here
    assert _comparable(by_worker.json()) == _comparable(by_thread.json())

    rows = {row.doc_id: row for row in gw_env.ledger_rows()}
    assert rows["LARGE-W"].document == large_invoice("LARGE-W")
    assert rows["LARGE-T"].document == large_invoice("LARGE-T")
    assert rows["LARGE-W"].digest != rows["LARGE-T"].digest
    worker_facts = json.loads(rows["LARGE-W"].facts)
    thread_facts = json.loads(rows["LARGE-T"].facts)
    assert worker_facts.pop("doc_id") == "LARGE-W" and thread_facts.pop("doc_id") == "LARGE-T"
    assert worker_facts == thread_facts

    messages = {m.get_string_property("B2BDocumentID"): m for m in gw_env.messages("invoices.inbound")}
    w, t = messages["LARGE-W"], messages["LARGE-T"]
    assert w.text == large_invoice("LARGE-W").decode("utf-8")
    ids = {"B2BDocumentID", "InvoiceID"}
    assert w.get_string_property("InvoiceID") == "LARGE-W"
    assert {n: w.get_object_property(n) for n in w.property_names() if n not in ids} == {
        n: t.get_object_property(n) for n in t.property_names() if n not in ids
    }
    assert w.jms_type == t.jms_type == "Invoice"


async def test_a_worker_keeps_idempotency_with_the_serving_process(gw_env):
    """Replays and conflicts are decided by the serving process's keys, whoever took the document in."""
    await ready(gw_env.gateway)
    first = await gw_env.client.post("/v1/documents", content=large_invoice("LARGE-I"), headers=GLOBEX)
    again = await gw_env.client.post("/v1/documents", content=large_invoice("LARGE-I"), headers=GLOBEX)
    changed = await gw_env.client.post(
        "/v1/documents", content=large_invoice("LARGE-I", line_extra=b"<!-- x -->"), headers=GLOBEX
    )
    assert first.status_code == 202 and again.status_code == 202, (first.text, again.text)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["message_id"] == first.json()["message_id"]
    assert changed.status_code == 409 and changed.json()["code"] == "idempotency-conflict"
    assert first.json()["message_id"] in changed.json()["detail"]
    assert gw_env.depth("invoices.inbound") == 1
    assert gw_env.gateway.intake_workers.counts["worker"] == 3


REFUSED = {
    "schema": large_invoice("BAD-1", line_extra=b"<cbc:Bogus>1</cbc:Bogus>"),
    "attributes": large_invoice("BAD-2").replace(
        b"<cac:InvoiceLine>", b"<cac:InvoiceLine " + b" ".join(b'a%d="1"' % i for i in range(300)) + b">", 1
    ),
    "well-formed": large_invoice("BAD-3")[:-40],
    "route": large_invoice("BAD-4"),  # posted by a partner the invoice route does not allow
}


async def test_a_worker_refuses_what_a_thread_refuses_with_the_same_answer(gw_env, monkeypatch):
    gateway = gw_env.gateway
    monkeypatch.setattr(gateway.intake, "explainer", None)  # libxml2's errors either way: the same report to compare
    await ready(gateway)
    answers = {}
    for workers in (gateway.intake_workers, None):
        monkeypatch.setattr(gateway.intake, "intake_workers", workers)
        for name, body in REFUSED.items():
            response = await gw_env.client.post(
                "/v1/documents", content=body, headers=ACME if name == "route" else GLOBEX
            )
            answers.setdefault(name, []).append((response.status_code, response.json()))
    codes = {name: [(status, body["code"]) for status, body in got] for name, got in answers.items()}
    assert codes == {
        "schema": [(400, "schema-invalid")] * 2,
        "attributes": [(400, "too-many-attributes")] * 2,
        "well-formed": [(400, "not-well-formed")] * 2,
        "route": [(403, "forbidden-route")] * 2,
    }
    for name, (by_worker, by_thread) in answers.items():
        assert by_worker == by_thread, name
    assert "cbc:Bogus" in answers["schema"][0][1]["errors"][0]["message"]
    assert answers["attributes"][0][1]["limit"] == "max_attributes"
    assert gw_env.ledger_rows() == [] and gw_env.depth("invoices.inbound") == 0


async def test_a_document_that_outlives_its_worker_is_refused_and_the_worker_replaced(gw_env, monkeypatch):
    gateway = gw_env.gateway
    workers = gateway.intake_workers
    await ready(gateway)
    before = {w.process.pid for w in workers._all}
    monkeypatch.setattr(workers, "timeout", 0.0)  # no document can be taken in within no time
    refused = await gw_env.client.post("/v1/documents", content=large_invoice("SLOW-1"), headers=GLOBEX)
    assert refused.status_code == 400 and refused.json()["code"] == "forbidden-xml"
    assert "bounds" in refused.json()["detail"]
    assert workers.counts["refused"] == 1

    monkeypatch.setattr(workers, "timeout", 10.0)
    await ready(gateway)
    assert len({w.process.pid for w in workers._all} - before) == 1  # the killed one's successor
    again = await gw_env.client.post("/v1/documents", content=large_invoice("SLOW-1"), headers=GLOBEX)
    assert again.status_code == 202, again.text
    assert [row.doc_id for row in gw_env.ledger_rows()] == ["SLOW-1"]


def _stopped(workers) -> list[int]:
    """Stop every worker (SIGSTOP: it gets none of the processor, as on a machine loaded by other work)."""
    pids = [w.process.pid for w in workers._all]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def _resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:  # killed meanwhile
            pass


async def test_a_document_whose_worker_is_starved_is_taken_in_all_the_same(gw_env, monkeypatch):
    """The bound is processor time: a worker that gets none for longer than it (here, stopped) still takes
    an honest document in."""
    gateway = gw_env.gateway
    workers = gateway.intake_workers
    await ready(gateway)
    monkeypatch.setattr(workers, "timeout", 0.5)
    pids = _stopped(workers)
    asyncio.get_running_loop().call_later(1.2, _resume, pids)
    started = time.monotonic()
    answer = await gw_env.client.post("/v1/documents", content=large_invoice("STARVED-1"), headers=GLOBEX)
    assert time.monotonic() - started >= 1.2
    assert answer.status_code == 202, answer.text
    assert workers.counts == {"worker": 1, "refused": 0, "thread": 0, "busy": 0}
    assert {w.process.pid for w in workers._all} == set(pids)  # none was stopped


async def test_a_document_whose_worker_gets_no_processor_time_gets_503_and_may_be_sent_again(gw_env, monkeypatch):
    """After the longest wait the document is answered 503 gateway-busy with Retry-After, not refused: the
    load is the cause. Nothing was accepted, so the same document is accepted when sent again."""
    gateway = gw_env.gateway
    workers = gateway.intake_workers
    await ready(gateway)
    monkeypatch.setattr(workers, "timeout", 0.5)
    monkeypatch.setattr(workers, "longest", 1.0)
    pids = _stopped(workers)
    try:
        started = time.monotonic()
        busy = await gw_env.client.post("/v1/documents", content=large_invoice("BUSY-1"), headers=GLOBEX)
        elapsed = time.monotonic() - started
    finally:
        _resume(pids)
    assert busy.status_code == 503 and busy.json()["code"] == "gateway-busy", busy.text
    assert busy.headers["retry-after"] == str(busy.json()["retry_after"]) and busy.json()["retry_after"] >= 1
    assert 1.0 <= elapsed < 4.0
    assert workers.counts["busy"] == 1 and workers.counts["refused"] == 0
    assert gw_env.ledger_rows() == []
    monkeypatch.setattr(workers, "timeout", 10.0)
    monkeypatch.setattr(workers, "longest", 20.0)
    await ready(gateway)  # the stopped worker's successor
    again = await gw_env.client.post("/v1/documents", content=large_invoice("BUSY-1"), headers=GLOBEX)
    assert again.status_code == 202, again.text
    assert "idempotent-replayed" not in again.headers
    assert [row.doc_id for row in gw_env.ledger_rows()] == ["BUSY-1"]


async def test_a_worker_that_died_between_documents_costs_no_answer(gw_env):
    gateway = gw_env.gateway
    workers = gateway.intake_workers
    await ready(gateway)
    for worker in list(workers._all):
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait()
    answer = await gw_env.client.post("/v1/documents", content=large_invoice("AFTER-1"), headers=GLOBEX)
    assert answer.status_code == 202, answer.text
    assert workers.counts["refused"] == 0 and workers.counts["thread"] >= 1
    await ready(gateway)  # and they come back
    answer = await gw_env.client.post("/v1/documents", content=large_invoice("AFTER-2"), headers=GLOBEX)
    assert answer.status_code == 202 and workers.counts["worker"] >= 1


async def post_with_server(make_assembly, tmp_path, server: dict, bodies: list[bytes]):
    """Post *bodies* at once to a gateway whose ``server:`` settings have *server* over the sample's; its
    answers and the gateway (stopped)."""
    import httpx
    from gwtest import sample_data

    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

    data = sample_data(tmp_path)
    data["server"].update(server)
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        gateway = runtime.gateway
        if gateway.intake_workers is not None:
            await ready(gateway)
        transport = httpx.ASGITransport(app=create_app(assembly, runtime=runtime))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
            answers = await asyncio.gather(
                *(client.post("/v1/documents", content=body, headers=GLOBEX) for body in bodies)
            )
        return answers, gateway
    finally:
        runtime.stop()


async def test_documents_that_find_every_worker_busy_wait_for_one(make_assembly, tmp_path, monkeypatch):
    """``server.intake_workers`` sets how many documents are taken in at once; the others wait for a worker
    rather than run in the serving process."""
    seen = never_in_this_process(monkeypatch)
    answers, gateway = await post_with_server(
        make_assembly, tmp_path, {"intake_workers": 1}, [large_invoice(f"ONE-{i}") for i in range(3)]
    )
    assert [a.status_code for a in answers] == [202] * 3, [a.text for a in answers]
    assert gateway.intake_workers.workers == 1
    assert gateway.intake_workers.counts == {"worker": 3, "refused": 0, "thread": 0, "busy": 0} and seen == []


async def test_no_intake_workers_takes_large_documents_in_on_threads(make_assembly, tmp_path):
    answers, gateway = await post_with_server(make_assembly, tmp_path, {"intake_workers": 0}, [large_invoice("NONE-1")])
    assert answers[0].status_code == 202, answers[0].text
    assert gateway.intake_workers is None


def test_settings_not_built_from_a_mapping_get_no_workers(make_assembly):
    from gateway.exchange.intake_workers import IntakeWorkers

    assembly = make_assembly()
    assert IntakeWorkers.shared(assembly, assembly.settings.limits, workers=0) is None
    assembly.settings.source = None
    assert IntakeWorkers.shared(assembly, assembly.settings.limits, workers=2) is None


# --------------------------------------------------------------------------- errors as plain data


@pytest.mark.parametrize(
    "error",
    [
        SchemaValidationError(
            "bad", [XMLErrorDetail(3, 4, "/Invoice/cbc:ID", "wrong")], omitted=7, schema="ubl-2.1/Invoice"
        ),
        TooManyAttributesError("many", [XMLErrorDetail(1, 2, None, "m")], limit="max_attributes", limit_value=256),
        NotWellFormedError("nwf", [XMLErrorDetail(9, None, None, "unclosed")]),
        GatewayError("a bug"),
    ],
)
def test_an_error_crosses_the_pipe_as_plain_data_and_comes_back_whole(error):
    data = json.loads(json.dumps(error_to_data(error)))
    back = error_from_data(data)
    assert type(back) is type(error)
    assert (back.status, back.to_dict(), str(back)) == (error.status, error.to_dict(), str(error))


@pytest.mark.parametrize(
    "data",
    [
        None,
        [],
        {"type": "builtins.SystemExit", "detail": "x"},
        {"type": "os.system", "detail": "x"},
        {"type": "gateway.errors.SchemaValidationError"},
        {"type": "gateway.errors.SchemaValidationError", "detail": "x", "errors": [[1, 2]]},
        {"type": "bug"},
    ],
)
def test_anything_but_a_gateway_error_from_a_worker_is_a_plain_500(data):
    error = error_from_data(data)
    assert type(error) is GatewayError and error.status == 500


def test_a_worker_cannot_set_private_or_odd_fields():
    data = error_to_data(TooManyAttributesError("many", limit="max_attributes", limit_value=256))
    data["fields"].update(
        {"_secret": 1, "__class__": "x", "not an identifier": 2, "limit_value": {"a": 1}, "detail": "y" * 10_000}
    )
    error = error_from_data(data)
    assert type(error) is TooManyAttributesError
    assert error.limit_value is None and not hasattr(error, "_secret")
    assert error.to_dict()["limit"] == "max_attributes"
