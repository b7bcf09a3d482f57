"""The delivery engine: each endpoint's queue drained by its own workers, on an event loop of its own.

The engine runs in a thread with its own asyncio loop, so neither a slow partner nor the engine's own
work ever waits in the gateway's loop; its store writes go through the store's group commit like
everyone's (the attempts in between without waiting for the disk).

Per endpoint (a *lane*): ``concurrency`` workers, each with a transacted session holding one message at a
time, so with one worker deliveries go out in order (a delivery is retried in place, the next one waits
behind it). A worker makes attempts through the endpoint's transport until one is delivered (the
acknowledgement and the ledger's ``delivered`` commit together), permanently refused, or out of attempts or
age (the message moves to the endpoint's dead-letter queue, the last answer kept in the ledger). Between
attempts: exponential backoff with full jitter, never shorter than ``Retry-After``; before each: the
endpoint's circuit breaker and rate limit. Lanes share nothing but the loop, so a failing partner only
ever waits on its own timers. If the process dies, the messages in flight come back to whichever process
serves next (the store's lease): at least once, with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from broker_core import Broker, Queue
from gateway.delivery.config import EndpointConfig
from gateway.delivery.metrics import DeliveryMetrics
from gateway.delivery.outbox import PROPERTY_CONTENT_TYPE, PROPERTY_TARGET
from gateway.delivery.policy import CircuitBreaker, RateLimiter, backoff_delay
from gateway.delivery.records import Attempt, DeliveryLedger, now_ms
from gateway.delivery.transport import AttemptResult, OutboundRequest, Transport, transport_kind
from gateway.errors import clip

__all__ = ["DeliveryEngine"]

log = logging.getLogger(__name__)
#: how long a worker waits for a message before looking at the stop flag again (seconds)
_POLL = 1.0
#: deliveries a worker acknowledges in one transaction at most, while more are waiting
_BATCH = 32


@dataclass
class Lane:
    """One endpoint's running state."""

    config: EndpointConfig
    transport: Transport
    breaker: CircuitBreaker
    limiter: RateLimiter
    in_flight: int = 0
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


class DeliveryEngine:
    """Delivers what waits in the endpoints' queues (see the module docstring)."""

    def __init__(
        self, broker: Broker, endpoints: Iterable[EndpointConfig], *, metrics: DeliveryMetrics | None = None
    ) -> None:
        self.broker = broker
        self.endpoints = list(endpoints)
        self.ledger = DeliveryLedger(broker.engine) if broker.engine is not None else None
        self.metrics = metrics or DeliveryMetrics()
        self.lanes: dict[tuple[str, str], Lane] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the engine's thread and its lanes; returns once they run."""
        if self._thread is not None or not self.endpoints:
            return
        self._thread = threading.Thread(target=self._run, name="b2b-delivery", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers (a message held between attempts goes back to its queue) and close transports."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if self._stopping is not None:
            loop.call_soon_threadsafe(self._stopping.set)
        thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:  # reported to start() or logged
            if not self._ready.is_set():
                self._error = exc
            else:
                log.exception("the delivery engine stopped")
        finally:
            self._ready.set()
            loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        if self.ledger is not None:
            await asyncio.to_thread(lambda: self.ledger.has_events)  # looked up once, off the loop
        connection = self.broker.connect(client_id=None)
        connection.start()
        try:
            for config in self.endpoints:
                kind = transport_kind(config.kind)
                if kind is None:
                    raise RuntimeError(f"endpoint kind {config.kind!r} is not registered")
                lane = Lane(
                    config,
                    kind.factory(config.transport),
                    CircuitBreaker(config.breaker),
                    RateLimiter(config.rate_limit),
                )
                self.lanes[(config.partner, config.name)] = lane
                for i in range(config.concurrency):
                    lane.tasks.append(
                        asyncio.create_task(self._worker(connection, lane), name=f"delivery {config.queue} #{i + 1}")
                    )
            self._ready.set()
            await self._stopping.wait()
            tasks = [t for lane in self.lanes.values() for t in lane.tasks]
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for lane in self.lanes.values():
                try:
                    await lane.transport.aclose()
                except Exception:  # keep closing the rest
                    log.exception("closing the transport of %s failed", lane.config.queue)
            connection.close()

    # ------------------------------------------------------------------ workers

    async def _worker(self, connection: object, lane: Lane) -> None:
        assert self._stopping is not None
        session = connection.create_session(transacted=True)  # type: ignore[attr-defined]
        consumer = session.create_consumer(Queue(lane.config.queue), prefetch=1)
        pending: list[tuple[str, Attempt, int]] = []
        try:
            while not self._stopping.is_set():
                try:
                    # with deliveries to acknowledge, only what is waiting already: none, and they commit now
                    message = await consumer.receive_async(timeout=0 if pending else _POLL)
                except Exception:  # the store is away: wait and try again
                    log.exception("receiving from %s failed", lane.config.queue)
                    self._give_back(session, pending, "the delivery engine failed")
                    await self._pause(5.0)
                    continue
                if message is None:
                    if pending:
                        await self._settle(lane, session, pending)
                    continue
                lane.in_flight += 1
                try:
                    await self._deliver(lane, session, message, pending)
                    if len(pending) >= _BATCH:
                        await self._settle(lane, session, pending)
                except Exception:  # give it back; it will be delivered again
                    log.exception("delivery of %s failed in the engine", message.jms_message_id)
                    self._give_back(session, pending, "the delivery engine failed")
                    await self._pause(1.0)
                finally:
                    lane.in_flight -= 1
            if pending:
                await self._settle(lane, session, pending)
        finally:
            try:
                session.rollback("the delivery engine stopped")
            except Exception:
                pass
            session.close()

    async def _settle(self, lane: Lane, session: object, pending: list[tuple[str, Attempt, int]]) -> None:
        """Acknowledge the deliveries the receiver took (*pending*) with their delivered attempts, in one
        transaction: none is acknowledged before its answer and its timeline row are committed."""
        fns = []
        if self.ledger is not None:
            fns.append(DeliveryLedger.record_delivered([(d, step) for d, step, _ in pending], self.ledger.has_events))
        await session.commit_async(in_transaction=fns)  # type: ignore[attr-defined]
        now = time.time()
        for _, _, queued_at in pending:
            self.metrics.delivered(lane.config, now - queued_at / 1000)
        pending.clear()

    @staticmethod
    def _give_back(session: object, pending: list[tuple[str, Attempt, int]], reason: str) -> None:
        """Roll back: the messages held come back to be delivered again (the same ``webhook-id``)."""
        pending.clear()
        try:
            session.rollback(reason)  # type: ignore[attr-defined]
        except Exception:
            log.exception("rolling back a delivery session failed")

    async def _pause(self, seconds: float) -> bool:
        """Sleep *seconds* unless the engine stops first; True when it stops."""
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=max(0.0, seconds))
            return True
        except TimeoutError:
            return False

    async def _deliver(
        self, lane: Lane, session: object, message: object, pending: list[tuple[str, Attempt, int]]
    ) -> None:
        """Attempt *message* until it settles; a delivered one joins *pending* (acknowledged by
        :meth:`_settle`), and whatever else happens to it first settles those before it."""
        config = lane.config
        delivery_id: str = message.jms_message_id  # type: ignore[attr-defined]
        body: bytes = message.get_body()  # type: ignore[attr-defined]
        content_type = message.get_string_property(PROPERTY_CONTENT_TYPE) or "application/xml"  # type: ignore[attr-defined]
        target = message.get_string_property(PROPERTY_TARGET)  # type: ignore[attr-defined]
        made, queued_at = 0, int(message.jms_timestamp)  # type: ignore[attr-defined]
        if message.jms_redelivered:  # type: ignore[attr-defined]
            # attempts were made before (by a process that died, or one that stopped): count on from them
            made, queued_at = await self._progress(delivery_id, made, queued_at)
        deadline = queued_at / 1000 + config.max_age
        last: AttemptResult | None = None
        assert self._stopping is not None
        while True:
            if self._stopping.is_set():
                if pending:
                    await self._settle(lane, session, pending)
                session.rollback("the delivery engine stopped")  # type: ignore[attr-defined]
                return
            if made and time.time() >= deadline and not message.jms_redelivered:  # type: ignore[attr-defined]
                # a replay (a fresh delivery count) restarts the age in the ledger: read it before giving up
                _, queued_at = await self._progress(delivery_id, made, queued_at)
                deadline = queued_at / 1000 + config.max_age
            if made >= config.max_attempts or (made and time.time() >= deadline):
                why = (
                    f"{made} attempts made (max_attempts {config.max_attempts})"
                    if made >= config.max_attempts
                    else f"older than max_age ({config.max_age:g} s)"
                )
                if pending:
                    await self._settle(lane, session, pending)
                await self._dead(lane, session, message, delivery_id, why, last)
                return
            await lane.breaker.admit()
            await lane.limiter.acquire()
            if self._stopping.is_set():
                lane.breaker.release()
                continue
            made += 1
            request = OutboundRequest(
                delivery_id, config.partner, config.name, body, content_type, made, _attempt_timeout(config), target
            )
            started = time.monotonic()
            try:
                last = await lane.transport.send(request)
            except Exception as exc:  # a transport's bug is a retryable attempt, not a lost message
                last = AttemptResult("retry", None, clip(f"transport error: {type(exc).__name__}: {exc}", 300))
            took = time.monotonic() - started
            lane.breaker.record(last.outcome)
            self.metrics.attempt(config, last.outcome, took)
            step = Attempt(
                made, now_ms(), config.name, last.outcome, last.status, last.detail, int(took * 1000), last.evidence
            )
            if last.outcome == "delivered":
                pending.append((delivery_id, step, queued_at))
                return
            if pending:  # not delivered (yet): what the receiver took is acknowledged before anything else
                await self._settle(lane, session, pending)
            if last.outcome == "failed":
                await self._dead(lane, session, message, delivery_id, f"permanent failure: {last.detail}", last, step)
                return
            if self.ledger is not None:
                await self.broker.write_async(
                    DeliveryLedger.record_attempt(delivery_id, step, failing=True), durable=False
                )
            if made >= config.max_attempts:
                continue
            delay = backoff_delay(config.backoff, made, last.retry_after)
            delay = min(delay, max(0.0, deadline - time.time()))
            if await self._pause(delay):
                session.rollback("the delivery engine stopped")  # type: ignore[attr-defined]
                return

    async def _progress(self, delivery_id: str, made: int, queued_at: int) -> tuple[int, int]:
        """(attempts made, queued_at) from the ledger, or the defaults given when it has no row."""
        if self.ledger is None:
            return made, queued_at
        progress = await asyncio.to_thread(self.ledger.progress, delivery_id)
        return progress if progress is not None else (made, queued_at)

    async def _dead(
        self,
        lane: Lane,
        session: object,
        message: object,
        delivery_id: str,
        why: str,
        last: AttemptResult | None,
        step: Attempt | None = None,
    ) -> None:
        """Record the delivery dead with its last answer, then move its message to the endpoint's dead-letter
        queue (an operator's replay or discard acts on what that queue holds). A crash in between brings the
        message back to a worker, which finds its attempts spent and dead-letters it again."""
        config = lane.config
        reason = clip(f"{why}; last answer: {last.detail if last else 'none'}", 500)
        if self.ledger is not None:
            if step is not None:
                fn = DeliveryLedger.record_attempt(delivery_id, step, "dead", failing=True)
            else:
                fn = DeliveryLedger.set_status([delivery_id], "dead")
            await self.broker.write_async(fn)
        await asyncio.to_thread(session.dead_letter, message, reason)  # type: ignore[attr-defined]
        self.metrics.dead(config)
        log.warning("delivery %s to %s/%s is dead: %s", delivery_id, config.partner, config.name, reason)

    # ------------------------------------------------------------------ introspection

    def circuit_states(self) -> dict[tuple[str, str], str]:
        return {key: lane.breaker.state for key, lane in self.lanes.items()}


def _attempt_timeout(config: EndpointConfig) -> float:
    return float(getattr(config.transport, "timeout", 30.0))
