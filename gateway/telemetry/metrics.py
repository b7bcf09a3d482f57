"""Prometheus metrics, served at ``/metrics`` (text exposition format); docs/operations-console.md lists them.

Two kinds. Counted as requests are served (``b2bgw_http_requests_total``, ``b2bgw_intake_duration_seconds``,
``b2bgw_request_reply_duration_seconds``, ``b2bgw_refusals_total``, the store's commit durations and batch
sizes): per process, summed over the processes of ``b2bgw serve --processes N`` through prometheus_client's
multiprocess mode (the supervisor sets up ``PROMETHEUS_MULTIPROC_DIR``). Read from the store
(``b2bgw_destination_*``, ``b2bgw_dead_letter_depth``, ``b2bgw_handler_outcomes_total``, the last warehouse
load's ``b2bgw_etl_last_run_*``): every process serves the admin sampler's last reading, at most
``admin.stats_interval`` old, so that a scrape never scans the tables.

On the intake's hot path a request costs a tuple appended to a queue; the counters and histograms are
updated from it by a thread once a second and before each scrape (:class:`HttpMetrics`).
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.registry import Collector

from gateway.telemetry.logs import fresh, restore

__all__ = ["HttpMetrics", "StoreMetrics", "add_exposition", "observe_commit", "scrape", "store_exposition"]

#: Parts that expose metrics of their own (outbound delivery's engines): each gives its exposition text.
_EXPOSITIONS: list[Callable[[], bytes]] = []


def add_exposition(part: Callable[[], bytes]) -> None:
    """Have *part*'s exposition text served with every scrape (a part above telemetry registers itself)."""
    if part not in _EXPOSITIONS:
        _EXPOSITIONS.append(part)


log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

HTTP_REQUESTS = Counter(
    "b2bgw_http_requests",
    "HTTP requests by route template, method, status and partner.",
    ["route", "method", "status", "partner"],
    registry=REGISTRY,
)
INTAKE = Histogram(
    "b2bgw_intake_duration_seconds",
    "POST /v1/documents, first byte to answer, by B2B route.",
    ["route"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
REQUEST_REPLY = Histogram(
    "b2bgw_request_reply_duration_seconds",
    "Request-reply documents answered with the backend's reply, by B2B route.",
    ["route"],
    buckets=_LATENCY,
    registry=REGISTRY,
)
REFUSALS = Counter("b2bgw_refusals", "Refused requests by RFC 9457 problem code.", ["code"], registry=REGISTRY)
COMMIT = Histogram(
    "b2bgw_store_commit_duration_seconds",
    "Store transactions (group commits), arrival to commit.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
    registry=REGISTRY,
)
COMMIT_BATCH = Histogram(
    "b2bgw_store_commit_batch_size",
    "Operations carried by each store transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    registry=REGISTRY,
)

_INTAKE_PATH = "/v1/documents"


def observe_commit(seconds: float, operations: int) -> None:
    """The store's commit observer (``Broker.observe_commits``)."""
    COMMIT.observe(seconds)
    COMMIT_BATCH.observe(operations)


class HttpMetrics:
    """Counts every HTTP request (an ASGI wrapper around the app's dispatch) and binds the log context of
    an accepted document (message id, correlation id, route) before uvicorn logs its access line.

    A request only appends one tuple to a queue: the counters and histograms are brought up to date from
    it at most a second later by a background thread, and before every scrape of this process
    (:meth:`flush`), each label set's increments added up (prometheus_client's per-value locks cost more
    than the rest of the bookkeeping together)."""

    FLUSH_EVERY = 1.0

    def __init__(self, partners: set[str]) -> None:
        self._partners = partners  # label values are configured partners only: the label set stays bounded
        self._pending: collections.deque[tuple[str, str, int, str | None, str | None, str | None, float]] = (
            collections.deque()
        )
        self._requests: dict[tuple[str, str, int, str], Any] = {}
        self._intake: dict[str, Any] = {}
        self._reply: dict[str, Any] = {}
        self._refusals: dict[str, Any] = {}
        self._flush_lock = threading.Lock()
        self._flusher: threading.Thread | None = None

    async def __call__(
        self, scope: Any, receive: Any, send: Any, dispatch: Callable[[Any, Any, Any], Awaitable[None]]
    ) -> None:
        started = time.perf_counter()
        state = [500, None]  # status, B2B route id
        path = scope["path"]
        fields: dict[str, str] = {}  # the request's log context (gateway.telemetry.logs), filled here directly

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status = state[0] = message["status"]
                if path == _INTAKE_PATH and status < 300:
                    for name, value in message.get("headers", ()):
                        key = _CONTEXT_HEADERS.get(name)
                        if key is not None:
                            fields[key] = value.decode("latin-1")
                    state[1] = fields.get("route")
            await send(message)

        token = fresh(fields)
        try:
            await dispatch(scope, receive, sending)
        finally:
            route = scope.get("route")
            self._pending.append(
                (
                    path if path == _INTAKE_PATH else getattr(route, "path", None) or "other",
                    scope["method"],
                    state[0],
                    fields.get("partner"),
                    fields.get("problem"),
                    state[1],
                    time.perf_counter() - started,
                )
            )
            restore(token)
            if self._flusher is None:
                self._start_flusher()

    def _start_flusher(self) -> None:
        with self._flush_lock:
            if self._flusher is None:
                self._flusher = threading.Thread(target=self._flush_loop, name="b2bgw-metrics", daemon=True)
                self._flusher.start()

    def _flush_loop(self) -> None:
        while True:
            time.sleep(self.FLUSH_EVERY)
            try:
                self.flush()
            except Exception:  # a metrics bug must not stop the counting
                log.exception("updating the HTTP metrics failed")

    def flush(self) -> None:
        """Add what the requests since the last flush counted to the metrics."""
        pending = self._pending
        if not pending:
            return
        with self._flush_lock:
            requests: collections.Counter[tuple[str, str, int, str]] = collections.Counter()
            refusals: collections.Counter[str] = collections.Counter()
            intake: dict[str, list[float]] = {}
            replies: dict[str, list[float]] = {}
            partners = self._partners
            while pending:
                try:
                    template, method, status, partner, problem, route_id, elapsed = pending.popleft()
                except IndexError:
                    break
                if partner is None or partner not in partners:
                    partner = "-"
                requests[(template, method[:10], status, partner)] += 1
                if status >= 400:
                    refusals[problem or f"http-{status}"] += 1
                if template == _INTAKE_PATH and method == "POST":
                    label = route_id or "-"
                    intake.setdefault(label, []).append(elapsed)
                    if status == 200:  # the backend's reply (a 202 is a receipt)
                        replies.setdefault(label, []).append(elapsed)
            for key, n in requests.items():
                child = self._requests.get(key)
                if child is None:
                    child = self._requests[key] = HTTP_REQUESTS.labels(key[0], key[1], str(key[2]), key[3])
                child.inc(n)
            for code, n in refusals.items():
                child = self._refusals.get(code)
                if child is None:
                    child = self._refusals[code] = REFUSALS.labels(code)
                child.inc(n)
            for metric, children, observed in ((INTAKE, self._intake, intake), (REQUEST_REPLY, self._reply, replies)):
                for label, values in observed.items():
                    child = children.get(label)
                    if child is None:
                        child = children[label] = metric.labels(label)
                    _observe_many(child, values)


_CONTEXT_HEADERS = {b"x-route-id": "route", b"x-message-id": "message_id", b"x-correlation-id": "correlation_id"}


def _observe_many(histogram: Any, values: list[float]) -> None:
    """Observe *values*: each bucket and the sum incremented once (through the histogram child's values,
    as its ``observe`` does one by one), else one ``observe`` each."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    total.inc(sum(values))


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class _Family:
    """One metric family in the text exposition format, its samples appended as they come."""

    def __init__(self, name: str, kind: str, text: str, labels: tuple[str, ...] = ()) -> None:
        self.sample = name + "_total" if kind == "counter" else name
        self.lines = [
            f"# HELP {self.sample if kind == 'counter' else name} {text}",
            f"# TYPE {self.sample if kind == 'counter' else name} {kind}",
        ]
        self.labels = labels

    def add(self, values: tuple[str, ...], value: float) -> None:
        if values:
            pairs = ",".join(f'{k}="{_label(v)}"' for k, v in zip(self.labels, values, strict=False))
            self.lines.append(f"{self.sample}{{{pairs}}} {_number(value)}")
        else:
            self.lines.append(f"{self.sample} {_number(value)}")


def store_exposition(snapshot: Any, dead_letter_prefix: str) -> str:
    """The store-derived metrics of one reading, in the text exposition format. Rendered here rather than
    through prometheus_client's collector, whose cost per sample adds up over thousands of destinations, and
    once per reading: every scrape until the next reading reuses the text (:class:`StoreMetrics`)."""
    dest = ("destination", "kind")
    depth = _Family("b2bgw_destination_depth", "gauge", "Messages waiting.", dest)
    flight = _Family("b2bgw_destination_in_flight", "gauge", "Delivered, not yet acknowledged.", dest)
    consumers = _Family("b2bgw_destination_consumers", "gauge", "Open consumers, of every process.", dest)
    oldest = _Family(
        "b2bgw_destination_oldest_age_seconds", "gauge", "How long the longest-waiting message has waited.", dest
    )
    enqueued = _Family("b2bgw_destination_enqueued", "counter", "Messages stored.", dest)
    outcomes = _Family("b2bgw_handler_outcomes", "counter", "Deliveries by outcome.", dest + ("outcome",))
    dead = _Family("b2bgw_dead_letter_depth", "gauge", "Messages in the queue's dead-letter queue.", ("destination",))
    now = snapshot.taken_at
    for s in snapshot.destinations:
        name = s.name
        if name.startswith(("temp-", "subscriber://")):
            continue
        kind = (
            "subscription"
            if s.topic or name.startswith("durable://")
            else ("dead-letter" if name.startswith(dead_letter_prefix) else "queue")
        )
        values = (name, kind)
        depth.add(values, s.depth)
        flight.add(values, s.in_flight)
        consumers.add(values, s.consumers)
        oldest.add(values, round(max(0.0, now - s.oldest / 1000), 3) if s.oldest else 0)
        enqueued.add(values, s.enqueued)
        outcomes.add((name, kind, "acknowledged"), s.dequeued)
        outcomes.add((name, kind, "redelivered"), s.redelivered)
        outcomes.add((name, kind, "dead_lettered"), s.dead_lettered)
        outcomes.add((name, kind, "expired"), s.expired)
        if kind == "dead-letter":
            dead.add(("queue://" + name[len(dead_letter_prefix) :],), s.depth)
    families = [depth, flight, consumers, oldest, enqueued, outcomes, dead]
    run = snapshot.etl_last_run
    if run is not None:
        for name, text, value in (
            (
                "b2bgw_etl_last_run_success",
                "1 when the last warehouse load succeeded.",
                1 if run.get("status") == "succeeded" else 0,
            ),
            ("b2bgw_etl_last_run_duration_seconds", "Duration of the last warehouse load.", run.get("duration_s")),
            ("b2bgw_etl_last_run_rows", "Rows the last warehouse load wrote.", run.get("rows_written")),
            ("b2bgw_etl_last_run_documents", "Documents the last warehouse load loaded.", run.get("loaded")),
            (
                "b2bgw_etl_last_run_timestamp_seconds",
                "When the last warehouse load finished.",
                (run.get("finished_at") or 0) / 1000 or None,
            ),
        ):
            if value is not None:
                family = _Family(name, "gauge", text)
                family.add((), value)
                families.append(family)
    return "\n".join(line for family in families for line in family.lines) + "\n"


class StoreMetrics:
    """The store-derived part of a scrape: the text of the sampler's last reading, rendered once per reading,
    and its age (which changes every scrape)."""

    def __init__(self, snapshot: Callable[[], Any], dead_letter_prefix: Callable[[], str]) -> None:
        self._snapshot = snapshot
        self._prefix = dead_letter_prefix
        self._rendered: tuple[Any, bytes] | None = None
        self._lock = threading.Lock()

    def exposition(self) -> bytes:
        try:
            snapshot = self._snapshot()
        except Exception:  # the store is away: the process's own metrics still go out
            return b""
        with self._lock:
            rendered = self._rendered
            if rendered is None or rendered[0] is not snapshot:
                rendered = self._rendered = (snapshot, store_exposition(snapshot, self._prefix()).encode("utf-8"))
        age = _Family("b2bgw_stats_age_seconds", "gauge", "Age of the reading the destination metrics come from.")
        age.add((), round(max(0.0, time.time() - snapshot.taken_at), 3))
        return rendered[1] + ("\n".join(age.lines) + "\n").encode("ascii")


def scrape(store: StoreMetrics | None = None, shared: Collector | None = None) -> tuple[bytes, str]:
    """The exposition: this process's (or, in multiprocess mode, every serving process's) metrics, then the
    store-derived ones (*store*, and *shared*: a collector that reads the store, the same in every process)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        own = generate_latest(registry)
    else:
        own = generate_latest(REGISTRY)
    if shared is not None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(shared)
        try:
            own += generate_latest(registry)
        except Exception:  # the store is away: the other metrics still go out
            log.warning("the retention metrics could not be read from the store", exc_info=True)
    for part in _EXPOSITIONS:
        own += part()
    return own + (store.exposition() if store is not None else b""), CONTENT_TYPE_LATEST
