"""/metrics: the names, types and labels a Prometheus scrape gets, counted by what the gateway did."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from gwtest import ACME, GLOBEX, INVOICE, ORDER, GatewayEnv, Responder, with_id
from prometheus_client.parser import text_string_to_metric_families

from broker_core import Queue
from gateway.http.app import create_app
from gateway.runtime.serving import Runtime
from gateway.telemetry.metrics import scrape

pytestmark = pytest.mark.anyio


def parse(text: str) -> dict[str, dict[str, object]]:
    """{family name: {"type": ..., "samples": [(sample name, labels, value)]}}."""
    out = {}
    for family in text_string_to_metric_families(text):
        out[family.name] = {"type": family.type, "samples": [(s.name, dict(s.labels), s.value) for s in family.samples]}
    return out


def value(metrics: dict, family: str, sample: str | None = None, **labels: str) -> float:
    """The sum of the samples of *family* (named *sample*, default the family's own) whose labels include
    *labels*; 0 when there is none."""
    found = metrics.get(family)
    if found is None:
        return 0.0
    name = sample or family
    return sum(v for n, ln, v in found["samples"] if n == name and all(ln.get(k) == x for k, x in labels.items()))


@pytest.fixture
async def env(make_assembly):
    assembly = make_assembly(admin={"metrics_on_partner_port": True})  # scraped without credentials
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    await app.state.ops.started(runtime)  # what the lifespan does: the store's commit observer
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test")
    try:
        yield GatewayEnv(assembly, runtime, app, client, responder)
    finally:
        await client.aclose()
        await app.state.ops.stopping()
        responder.stop()
        runtime.stop()


async def scraped(env: GatewayEnv) -> dict:
    env.app.state.ops.service.sampler.refresh()
    r = await env.client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=")  # the text exposition format
    return parse(r.text)


async def test_requests_refusals_and_latencies_are_counted_by_route_status_and_partner(env):
    before = await scraped(env)
    c = env.client
    r = await c.post("/v1/documents", content=with_id(INVOICE, "INV-M1"), headers=GLOBEX)
    assert r.status_code == 202
    r = await c.post("/v1/documents", content=with_id(ORDER, "PO-M1"), headers=ACME)
    assert r.status_code == 200
    assert (
        await c.post("/v1/documents", content=INVOICE, headers={"Content-Type": "application/xml"})
    ).status_code == 401
    assert (
        await c.post("/v1/documents", content=INVOICE, headers={**GLOBEX, "Content-Type": "text/csv"})
    ).status_code == 415
    assert (await c.get(f"/v1/documents/{r.headers['x-message-id']}", headers=ACME)).status_code == 200
    assert (await c.get("/no/such/path/" + "x" * 50)).status_code == 404
    after = await scraped(env)

    def delta(family: str, sample: str | None = None, **labels: str) -> float:
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    assert after["b2bgw_http_requests"]["type"] == "counter"
    assert (
        delta(
            "b2bgw_http_requests",
            "b2bgw_http_requests_total",
            route="/v1/documents",
            method="POST",
            status="202",
            partner="globex",
        )
        == 1
    )
    assert (
        delta("b2bgw_http_requests", "b2bgw_http_requests_total", route="/v1/documents", status="200", partner="acme")
        == 1
    )
    assert (
        delta("b2bgw_http_requests", "b2bgw_http_requests_total", route="/v1/documents", status="401", partner="-") == 1
    )
    assert (
        delta(
            "b2bgw_http_requests",
            "b2bgw_http_requests_total",
            route="/v1/documents/{message_id}",
            method="GET",
            status="200",
            partner="acme",
        )
        == 1
    )
    assert delta("b2bgw_http_requests", "b2bgw_http_requests_total", route="other", status="404") == 1
    routes = {labels["route"] for _, labels, _ in after["b2bgw_http_requests"]["samples"]}
    assert not any(r.startswith("/no/") for r in routes)  # unknown paths never become label values
    assert delta("b2bgw_refusals", "b2bgw_refusals_total", code="unauthenticated") == 1
    assert delta("b2bgw_refusals", "b2bgw_refusals_total", code="unsupported-media-type") == 1
    assert after["b2bgw_intake_duration_seconds"]["type"] == "histogram"
    assert delta("b2bgw_intake_duration_seconds", "b2bgw_intake_duration_seconds_count", route="ubl-invoice") == 1
    assert delta("b2bgw_intake_duration_seconds", "b2bgw_intake_duration_seconds_count", route="-") == 2
    assert (
        delta("b2bgw_intake_duration_seconds", "b2bgw_intake_duration_seconds_bucket", route="ubl-invoice", le="+Inf")
        == 1
    )
    assert (
        delta("b2bgw_request_reply_duration_seconds", "b2bgw_request_reply_duration_seconds_count", route="ubl-order")
        == 1
    )
    assert (
        delta("b2bgw_request_reply_duration_seconds", "b2bgw_request_reply_duration_seconds_count", route="ubl-invoice")
        == 0
    )
    assert delta("b2bgw_store_commit_duration_seconds", "b2bgw_store_commit_duration_seconds_count") >= 2
    assert delta("b2bgw_store_commit_batch_size", "b2bgw_store_commit_batch_size_sum") >= 2


async def test_destinations_dead_letters_and_outcomes_come_from_the_store(env):
    c = env.client
    for n in range(3):
        assert (await c.post("/v1/documents", content=with_id(INVOICE, f"INV-S{n}"), headers=GLOBEX)).status_code == 202
    assert (await c.post("/v1/documents", content=with_id(ORDER, "PO-S1"), headers=ACME)).status_code == 200
    conn = env.broker.connect()
    conn.start()
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(Queue("invoices.inbound"))
    for _ in range(2):  # max_deliveries is 2: the first invoice is dead-lettered
        assert consumer.receive(timeout=2) is not None
        session.rollback()
    conn.close()
    metrics = await scraped(env)
    inv = {"destination": "queue://invoices.inbound", "kind": "queue"}
    assert metrics["b2bgw_destination_depth"]["type"] == "gauge"
    assert value(metrics, "b2bgw_destination_depth", **inv) == 2
    assert (
        value(metrics, "b2bgw_destination_depth", destination="queue://DLQ.invoices.inbound", kind="dead-letter") == 1
    )
    assert value(metrics, "b2bgw_dead_letter_depth", destination="queue://invoices.inbound") == 1
    assert value(metrics, "b2bgw_destination_enqueued", "b2bgw_destination_enqueued_total", **inv) == 3
    assert value(metrics, "b2bgw_handler_outcomes", "b2bgw_handler_outcomes_total", outcome="redelivered", **inv) == 1
    assert value(metrics, "b2bgw_handler_outcomes", "b2bgw_handler_outcomes_total", outcome="dead_lettered", **inv) == 1
    assert (
        value(
            metrics,
            "b2bgw_handler_outcomes",
            "b2bgw_handler_outcomes_total",
            outcome="acknowledged",
            destination="queue://orders.inbound",
        )
        == 1
    )
    assert value(metrics, "b2bgw_destination_consumers", destination="queue://orders.inbound") == 1  # the responder
    assert 0 <= value(metrics, "b2bgw_destination_oldest_age_seconds", **inv) < 60
    assert 0 <= value(metrics, "b2bgw_stats_age_seconds") < 60
    assert not any(ln["destination"].startswith("temp-") for _, ln, _ in metrics["b2bgw_destination_depth"]["samples"])


async def test_the_last_warehouse_load_is_reported(env):
    from spark_etl import state

    engine = env.broker.engine
    state.upgrade(engine)
    run_id = state.start_run(engine, mode="incremental", owner="test", seq_from=0, seq_to=10)
    started = int(time.time() * 1000) - 4000
    state.update_run(
        engine, run_id, status="succeeded", started_at=started, finished_at=started + 2500, rows_written=42, loaded=7
    )
    metrics = await scraped(env)
    assert value(metrics, "b2bgw_etl_last_run_success") == 1.0
    assert value(metrics, "b2bgw_etl_last_run_duration_seconds") == pytest.approx(2.5)
    assert value(metrics, "b2bgw_etl_last_run_rows") == 42
    assert value(metrics, "b2bgw_etl_last_run_documents") == 7
    assert value(metrics, "b2bgw_etl_last_run_timestamp_seconds") == pytest.approx((started + 2500) / 1000)


async def test_the_retention_metrics_come_from_the_store(env):
    from ledger_contract.tables import archive_batches

    env.app.state.ops._lifecycle.ttl = 0  # read the store at every scrape
    metrics = await scraped(env)
    assert metrics["b2bgw_ledger_tombstones"]["type"] == "gauge"
    assert value(metrics, "b2bgw_ledger_tombstones") == 0
    now = int(time.time() * 1000)
    with env.broker.engine.begin() as conn:  # what an archive run leaves: a batch archived and purged
        conn.execute(
            archive_batches.insert(),
            {
                "run_id": 1,
                "kind": "archive",
                "status": "purged",
                "created_at": now,
                "updated_at": now,
                "documents": 3,
                "purged": 3,
                "bytes": 4096,
            },
        )
    metrics = await scraped(env)
    assert value(metrics, "b2bgw_ledger_tombstones") == 3
    assert value(metrics, "b2bgw_archive_documents", "b2bgw_archive_documents_total", kind="archive") == 3
    assert value(metrics, "b2bgw_archive_bytes", "b2bgw_archive_bytes_total") == 4096


def test_multiprocess_mode_sums_what_every_serving_process_counted(tmp_path, monkeypatch):
    code = (
        "from gateway.telemetry.metrics import HTTP_REQUESTS, INTAKE\n"
        "HTTP_REQUESTS.labels('/v1/documents', 'POST', '202', 'acme').inc(3)\n"
        "INTAKE.labels('ubl-order').observe(0.004)\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for _ in range(2):  # two serving processes, one after the other (the files outlive them)
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    body, media = scrape()
    metrics = parse(body.decode())
    assert value(metrics, "b2bgw_http_requests", "b2bgw_http_requests_total", partner="acme", status="202") == 6
    assert (
        value(metrics, "b2bgw_intake_duration_seconds", "b2bgw_intake_duration_seconds_count", route="ubl-order") == 2
    )
    assert (
        value(
            metrics,
            "b2bgw_intake_duration_seconds",
            "b2bgw_intake_duration_seconds_bucket",
            route="ubl-order",
            le="0.005",
        )
        == 2
    )


async def test_the_sample_dashboard_uses_only_metrics_a_scrape_has(env):
    import json
    import re
    from pathlib import Path

    from spark_etl import state

    engine = env.broker.engine
    state.upgrade(engine)
    run_id = state.start_run(engine, mode="incremental", owner="test", seq_from=0, seq_to=1)
    state.update_run(engine, run_id, status="failed", finished_at=int(time.time() * 1000), rows_written=0, loaded=0)
    await env.client.post("/v1/documents", content=with_id(INVOICE, "INV-G"), headers=GLOBEX)
    await env.client.post("/v1/documents", content=with_id(ORDER, "PO-G"), headers=ACME)
    await env.client.post("/v1/documents", content=b"<x", headers=GLOBEX)
    metrics = await scraped(env)
    samples = set(metrics) | {name for family in metrics.values() for name, _, _ in family["samples"]}
    dashboard = json.loads((Path(__file__).resolve().parents[3] / "docs" / "grafana-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\bb2bgw_[a-z_]+", target["expr"]))
    assert used and used <= samples, used - samples
