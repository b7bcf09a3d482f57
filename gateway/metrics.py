"""Prometheus metrics, served at ``/metrics`` (text exposition format).

Counted as requests are served (per process; summed over the processes of
``b2bgw serve --processes N`` through prometheus_client's multiprocess mode,
whose directory the supervisor sets up in ``PROMETHEUS_MULTIPROC_DIR``):

==========================================  ==========================================================
``b2bgw_http_requests_total``               requests by ``route`` (the path template), ``method``,
                                            ``status`` and ``partner`` (``-`` when none authenticated)
``b2bgw_intake_duration_seconds``           histogram of ``POST /v1/documents`` from the first byte to
                                            the answer, by B2B ``route`` (``-`` when refused)
``b2bgw_request_reply_duration_seconds``    histogram of request-reply documents answered with the
                                            backend's reply, by ``route``
``b2bgw_refusals_total``                    refused requests by problem ``code`` (RFC 9457)
``b2bgw_store_commit_duration_seconds``     histogram of the store's transactions (group commits)
``b2bgw_store_commit_batch_size``           histogram of the operations each transaction carried
==========================================  ==========================================================

Read from the store (every process sees the same, from the admin sampler's
last reading, at most ``admin.stats_interval`` old; a scrape never scans the
tables), labelled by ``destination`` and ``kind`` (queue, dead-letter,
subscription):

==========================================  ==========================================================
``b2bgw_destination_depth``                 messages waiting
``b2bgw_destination_in_flight``             delivered, not yet acknowledged
``b2bgw_destination_consumers``             open consumers, of every process
``b2bgw_destination_oldest_age_seconds``    how long the longest-waiting message has waited
``b2bgw_destination_enqueued_total``        messages stored
``b2bgw_dead_letter_depth``                 messages in a queue's dead-letter queue (``destination``:
                                            the queue they failed in)
``b2bgw_handler_outcomes_total``            deliveries by ``outcome``: ``acknowledged``,
                                            ``redelivered`` (given back: a rollback, a failed
                                            handler), ``dead_lettered``, ``expired``
``b2bgw_stats_age_seconds``                 age of the reading these come from
``b2bgw_etl_last_run_success``              1 when the last warehouse load succeeded, else 0
``b2bgw_etl_last_run_duration_seconds``     its duration
``b2bgw_etl_last_run_rows``                 rows it wrote
``b2bgw_etl_last_run_documents``            documents it loaded
``b2bgw_etl_last_run_timestamp_seconds``    when it finished
==========================================  ==========================================================

On the intake's hot path a request costs one dictionary look-up of its label
values, a counter increment and, for ``POST /v1/documents``, one histogram
observation (see ``bench/ops_bench.py`` for the measured cost).
"""

from __future__ import annotations

import os
import time
from typing import Any, Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .logs import bind, fresh, partner_var, problem_var, restore

__all__ = ["HttpMetrics", "StoreCollector", "observe_commit", "scrape"]

REGISTRY = CollectorRegistry(auto_describe=True)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter("b2bgw_http_requests", "HTTP requests by route template, method, status and partner.",
                        ["route", "method", "status", "partner"], registry=REGISTRY)
INTAKE = Histogram("b2bgw_intake_duration_seconds", "POST /v1/documents, first byte to answer, by B2B route.",
                   ["route"], buckets=_LATENCY, registry=REGISTRY)
REQUEST_REPLY = Histogram("b2bgw_request_reply_duration_seconds",
                          "Request-reply documents answered with the backend's reply, by B2B route.",
                          ["route"], buckets=_LATENCY, registry=REGISTRY)
REFUSALS = Counter("b2bgw_refusals", "Refused requests by RFC 9457 problem code.", ["code"], registry=REGISTRY)
COMMIT = Histogram("b2bgw_store_commit_duration_seconds", "Store transactions (group commits), arrival to commit.",
                   buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
                   registry=REGISTRY)
COMMIT_BATCH = Histogram("b2bgw_store_commit_batch_size", "Operations carried by each store transaction.",
                         buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=REGISTRY)

_INTAKE_PATH = "/v1/documents"


def observe_commit(seconds: float, operations: int) -> None:
    """The store's commit observer (``Broker.observe_commits``)."""
    COMMIT.observe(seconds)
    COMMIT_BATCH.observe(operations)


class HttpMetrics:
    """Counts every HTTP request (an ASGI wrapper around the app's dispatch) and binds the log context of
    an accepted document (message id, correlation id, route) before uvicorn logs its access line."""

    def __init__(self, partners: set[str]) -> None:
        self._partners = partners  # label values are configured partners only: the label set stays bounded
        self._requests: dict[tuple[str, str, int, str], Any] = {}
        self._intake: dict[str, Any] = {}
        self._reply: dict[str, Any] = {}
        self._refusals: dict[str, Any] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any,
                       dispatch: Callable[[Any, Any, Any], Awaitable[None]]) -> None:
        started = time.perf_counter()
        state = [500, None]  # status, B2B route id

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                state[0] = message["status"]
                if scope["path"] == _INTAKE_PATH and state[0] < 300:
                    found = {}
                    for name, value in message.get("headers", ()):
                        if name in (b"x-route-id", b"x-message-id", b"x-correlation-id"):
                            found[name] = value.decode("latin-1")
                    state[1] = found.get(b"x-route-id")
                    bind(message_id=found.get(b"x-message-id"), correlation_id=found.get(b"x-correlation-id"),
                         route=state[1])
            await send(message)

        tokens = fresh()
        try:
            await dispatch(scope, receive, sending)
        finally:
            self._record(scope, state[0], state[1], time.perf_counter() - started)
            restore(tokens)

    def _record(self, scope: Any, status: int, route_id: str | None, elapsed: float) -> None:
        path = scope["path"]
        route = scope.get("route")
        template = path if path == _INTAKE_PATH else getattr(route, "path", None) or "other"
        partner = partner_var.get()
        if partner is None or partner not in self._partners:
            partner = "-"
        key = (template, scope["method"], status, partner)
        child = self._requests.get(key)
        if child is None:
            child = self._requests[key] = HTTP_REQUESTS.labels(template, scope["method"][:10], str(status), partner)
        child.inc()
        if status >= 400:
            code = problem_var.get() or ("http-" + str(status))
            refused = self._refusals.get(code)
            if refused is None:
                refused = self._refusals[code] = REFUSALS.labels(code)
            refused.inc()
        if template == _INTAKE_PATH and scope["method"] == "POST":
            label = route_id or "-"
            hist = self._intake.get(label)
            if hist is None:
                hist = self._intake[label] = INTAKE.labels(label)
            hist.observe(elapsed)
            if status == 200:  # the backend's reply (a 202 is a receipt)
                hist = self._reply.get(label)
                if hist is None:
                    hist = self._reply[label] = REQUEST_REPLY.labels(label)
                hist.observe(elapsed)


class StoreCollector:
    """The store-derived metrics, from a callable returning the admin sampler's last reading."""

    def __init__(self, snapshot: Callable[[], Any], dead_letter_prefix: Callable[[], str]) -> None:
        self._snapshot = snapshot
        self._prefix = dead_letter_prefix

    def describe(self) -> list[Any]:
        return []  # collected only when scraped: nothing to describe at registration

    def collect(self) -> Any:
        try:
            snapshot = self._snapshot()
        except Exception:  # noqa: BLE001 - the store is away: the process's own metrics still go out
            return
        if snapshot is None:
            return
        prefix = self._prefix()
        labels = ["destination", "kind"]
        depth = GaugeMetricFamily("b2bgw_destination_depth", "Messages waiting.", labels=labels)
        flight = GaugeMetricFamily("b2bgw_destination_in_flight", "Delivered, not yet acknowledged.", labels=labels)
        consumers = GaugeMetricFamily("b2bgw_destination_consumers", "Open consumers, of every process.",
                                      labels=labels)
        oldest = GaugeMetricFamily("b2bgw_destination_oldest_age_seconds",
                                   "How long the longest-waiting message has waited.", labels=labels)
        enqueued = CounterMetricFamily("b2bgw_destination_enqueued", "Messages stored.", labels=labels)
        outcomes = CounterMetricFamily("b2bgw_handler_outcomes", "Deliveries by outcome.",
                                       labels=["destination", "kind", "outcome"])
        dead = GaugeMetricFamily("b2bgw_dead_letter_depth", "Messages in the queue's dead-letter queue.",
                                 labels=["destination"])
        now = snapshot.taken_at
        for s in snapshot.destinations:
            name = s.name
            if name.startswith(("temp-", "subscriber://")):
                continue
            kind = "subscription" if s.topic or name.startswith("durable://") else (
                "dead-letter" if name.startswith(prefix) else "queue")
            values = [name, kind]
            depth.add_metric(values, s.depth)
            flight.add_metric(values, s.in_flight)
            consumers.add_metric(values, s.consumers)
            oldest.add_metric(values, max(0.0, now - s.oldest / 1000) if s.oldest else 0.0)
            enqueued.add_metric(values, s.enqueued)
            for outcome, n in (("acknowledged", s.dequeued), ("redelivered", s.redelivered),
                               ("dead_lettered", s.dead_lettered), ("expired", s.expired)):
                outcomes.add_metric([name, kind, outcome], n)
            if kind == "dead-letter":
                dead.add_metric(["queue://" + name[len(prefix):]], s.depth)
        yield from (depth, flight, consumers, oldest, enqueued, outcomes, dead)
        age = GaugeMetricFamily("b2bgw_stats_age_seconds", "Age of the reading the destination metrics come from.")
        age.add_metric([], max(0.0, time.time() - now))
        yield age
        run = snapshot.etl_last_run
        if run is not None:
            for name, text, value in (
                ("b2bgw_etl_last_run_success", "1 when the last warehouse load succeeded.",
                 1.0 if run.get("status") == "succeeded" else 0.0),
                ("b2bgw_etl_last_run_duration_seconds", "Duration of the last warehouse load.", run.get("duration_s")),
                ("b2bgw_etl_last_run_rows", "Rows the last warehouse load wrote.", run.get("rows_written")),
                ("b2bgw_etl_last_run_documents", "Documents the last warehouse load loaded.", run.get("loaded")),
                ("b2bgw_etl_last_run_timestamp_seconds", "When the last warehouse load finished.",
                 (run.get("finished_at") or 0) / 1000 or None),
            ):
                if value is not None:
                    family = GaugeMetricFamily(name, text)
                    family.add_metric([], float(value))
                    yield family


def scrape(store_registry: CollectorRegistry) -> tuple[bytes, str]:
    """The exposition: this process's (or, in multiprocess mode, every serving process's) metrics, then the
    store-derived ones."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        own = generate_latest(registry)
    else:
        own = generate_latest(REGISTRY)
    return own + generate_latest(store_registry), CONTENT_TYPE_LATEST
