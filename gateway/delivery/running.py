"""The delivery engine in a serving process: started with the runtime, read by ``/metrics``."""

from __future__ import annotations

import logging
from typing import Any

from broker_core import Broker, Queue
from gateway.delivery.config import EndpointConfig
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.notify import StatusNotifier
from gateway.delivery.records import current_revision, head_revision, upgrade_deliveries
from gateway.errors import ConfigError
from gateway.telemetry.metrics import add_exposition

__all__ = ["all_endpoints", "exposition", "start_delivery", "upgrade_deliveries"]

log = logging.getLogger(__name__)
_ENGINES: list[DeliveryEngine] = []


def all_endpoints(partners: Any) -> list[EndpointConfig]:
    """Every endpoint of every enabled partner of a :class:`~gateway.routing.partners.PartnerRegistry`."""
    return [
        endpoint
        for partner in partners.partners.values()
        if partner.enabled
        for endpoint in partner.delivery.endpoints.values()
    ]


def start_delivery(partners: Any, broker: Broker) -> DeliveryEngine | None:
    """Start the engine on the configured endpoints; None when no partner has one."""
    endpoints = all_endpoints(partners)
    if not endpoints or broker.engine is None:
        return None
    if broker.engine.dialect.name != "sqlite" and current_revision(broker.engine) != head_revision():
        raise ConfigError("the deliveries' tables are not current: run `b2bgw db upgrade` first")
    engine = DeliveryEngine(broker, endpoints)
    engine.start()
    notifier = StatusNotifier(broker, partners)
    notifier.start()
    _ENGINES.append(engine)
    original_stop = engine.stop

    def stop(timeout: float = 30.0) -> None:
        notifier.stop()
        original_stop(timeout)
        if engine in _ENGINES:
            _ENGINES.remove(engine)

    engine.stop = stop  # type: ignore[method-assign]
    log.info("delivering to %d endpoint(s)", len(endpoints))
    return engine


def exposition() -> bytes:
    """The delivery metrics of the engines running in this process (empty when none runs)."""
    out = []
    for engine in list(_ENGINES):
        depths: dict[tuple[str, str], int] = {}
        for key, lane in engine.lanes.items():
            try:
                depths[key] = engine.broker.stats(Queue(lane.config.queue)).depth
            except Exception:  # the store is away: the counters still go out
                pass
        out.append(engine.metrics.render(depths, engine.circuit_states()))
    return "".join(out).encode("utf-8")


add_exposition(exposition)  # served with every scrape of /metrics
