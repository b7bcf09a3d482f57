"""Partners' delivery endpoints, read from ``partners.yaml`` (``endpoints:`` and ``notify:`` of a partner).

The keys every kind shares (the engine's: ordering, the rate limit, retries, the breaker) are read here;
the rest of an endpoint goes to its kind's ``parse_endpoint`` from the transport registry, so a new kind
needs no change here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.delivery.addresses import AddressPolicy, parse_policy
from gateway.delivery.transport import known_kinds, transport_kind
from gateway.errors import clip
from gateway.marked import (
    MarkedDict,
    check_keys,
    expect_int,
    expect_mapping,
    expect_str,
    parse_duration,
)

__all__ = [
    "COMMON_KEYS",
    "Backoff",
    "Breaker",
    "EndpointConfig",
    "PartnerDelivery",
    "parse_delivery_section",
    "parse_partner_delivery",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")

#: The keys the engine reads from every endpoint, whatever its kind.
COMMON_KEYS = frozenset({"kind", "concurrency", "rate_limit", "max_attempts", "max_age", "backoff", "breaker"})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: attempt *n* waits a random time up to
    ``min(maximum, initial * 2**(n-1))``."""

    initial: float = 1.0
    maximum: float = 300.0


@dataclass(frozen=True, slots=True)
class Breaker:
    """After ``failures`` consecutive failed attempts the endpoint rests ``cooldown`` seconds, then one probe."""

    failures: int = 5
    cooldown: float = 30.0


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """One delivery endpoint of one partner."""

    partner: str
    name: str
    kind: str
    transport: Any  # the kind's own configuration object
    concurrency: int = 1
    rate_limit: float | None = None  # deliveries per second, None: unlimited
    max_attempts: int = 12
    max_age: float = 86400.0
    backoff: Backoff = field(default_factory=Backoff)
    breaker: Breaker = field(default_factory=Breaker)
    #: made by the gateway for deliveries of its own (asynchronous AS2 MDNs), whose address comes with each
    #: delivery: documents are never sent to it, and it is never a partner's one endpoint by default
    implicit: bool = False

    @property
    def queue(self) -> str:
        """The persistent queue this endpoint's deliveries wait in."""
        return f"b2b.delivery.{self.partner}.{self.name}"

    @property
    def dead_queue(self) -> str:
        """Where its dead deliveries wait for an operator (the broker's dead-letter naming)."""
        return f"DLQ.{self.queue}"


@dataclass(frozen=True, slots=True)
class PartnerDelivery:
    """A partner's endpoints, and which of them receives its late replies and status notifications."""

    endpoints: dict[str, EndpointConfig] = field(default_factory=dict)
    late_replies: str | None = None
    status_notifications: str | None = None
    statuses: tuple[str, ...] = ("delivered", "failed")


NO_DELIVERY = PartnerDelivery()


def parse_partner_delivery(
    entry: MarkedDict, partner_id: str, addresses: AddressPolicy | None = None
) -> PartnerDelivery:
    """Read a partner's ``endpoints:`` and ``notify:`` (ConfigError with file and line); *addresses* are the
    gateway's ``delivery.allow_addresses`` and ``deny_addresses``, put under every endpoint's own."""
    if "endpoints" not in entry and "notify" not in entry:
        return NO_DELIVERY
    what = f"partner {partner_id!r}"
    section = expect_mapping(entry.get("endpoints"), entry.at("endpoints"), f"{what} endpoints")
    endpoints: dict[str, EndpointConfig] = {}
    for name, body in section.items():
        where = section.at(name)
        if not isinstance(name, str) or not _NAME.match(name):
            raise where.error(f"{what}: endpoint name {clip(str(name), 60)!r} must be 1-64 letters, digits, '-' or '_'")
        endpoints[name] = _endpoint(
            partner_id, name, expect_mapping(body, where, f"{what} endpoint {name!r}"), addresses
        )
    notify = expect_mapping(entry.get("notify"), entry.at("notify"), f"{what} notify")
    check_keys(notify, {"late_replies", "status", "statuses"}, f"{what} notify")
    late = _endpoint_name(notify, "late_replies", endpoints, what)
    status = _endpoint_name(notify, "status", endpoints, what)
    statuses: tuple[str, ...] = ("delivered", "failed")
    if "statuses" in notify:
        raw = notify["statuses"]
        if not isinstance(raw, list) or not raw or any(s not in _STATUSES for s in raw):
            raise notify.at("statuses").error(
                f"{what} notify.statuses must be a list of {', '.join(_STATUSES)}; got {clip(repr(raw), 80)}"
            )
        statuses = tuple(raw)
    return PartnerDelivery(endpoints, late, status, statuses)


_STATUSES = ("accepted", "delivered", "replied", "failed", "dead_lettered")


def _endpoint_name(notify: MarkedDict, key: str, endpoints: dict[str, EndpointConfig], what: str) -> str | None:
    if key not in notify:
        return None
    name = expect_str(notify[key], notify.at(key), f"{what} notify.{key}")
    if name not in endpoints:
        raise notify.at(key).error(
            f"{what} notify.{key} names endpoint {clip(name, 60)!r}, which is not among "
            f"its endpoints ({', '.join(sorted(endpoints)) or 'none configured'})"
        )
    return name


def _endpoint(partner: str, name: str, body: MarkedDict, addresses: AddressPolicy | None) -> EndpointConfig:
    what = f"partner {partner!r} endpoint {name!r}"
    kind_name = body.get("kind", "https")
    kind = transport_kind(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        raise body.at("kind").error(
            f"{what}: kind {clip(repr(kind_name), 40)} is not known; known kinds: {', '.join(known_kinds())}"
        )
    own = type(body)({k: v for k, v in body.items() if k not in COMMON_KEYS})
    own.where = body.where
    own.key_where = {k: body.at(k) for k in own}
    transport = kind.parse_endpoint(own, body.where, what)
    if addresses is not None and isinstance(getattr(transport, "addresses", None), AddressPolicy):
        transport = replace(transport, addresses=transport.addresses.within(addresses))
    concurrency = expect_int(
        body.get("concurrency", 1), body.at("concurrency"), f"{what} concurrency", minimum=1, maximum=256
    )
    rate = body.get("rate_limit")
    if rate is not None:
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0:
            raise body.at("rate_limit").error(
                f"{what} rate_limit must be a positive number of deliveries per second; got {clip(repr(rate), 40)}"
            )
        rate = float(rate)
    attempts = expect_int(
        body.get("max_attempts", 12), body.at("max_attempts"), f"{what} max_attempts", minimum=1, maximum=1000
    )
    max_age = parse_duration(body.get("max_age", "24h"), body.at("max_age"), f"{what} max_age")
    if max_age <= 0:
        raise body.at("max_age").error(f"{what} max_age must be more than zero")
    backoff_map = expect_mapping(body.get("backoff"), body.at("backoff"), f"{what} backoff")
    check_keys(backoff_map, {"initial", "max"}, f"{what} backoff")
    backoff = Backoff(
        parse_duration(backoff_map.get("initial", 1), backoff_map.at("initial"), f"{what} backoff.initial"),
        parse_duration(backoff_map.get("max", "5m"), backoff_map.at("max"), f"{what} backoff.max"),
    )
    if backoff.initial <= 0 or backoff.maximum < backoff.initial:
        raise backoff_map.where.error(f"{what} backoff: initial must be more than zero and max at least initial")
    breaker_map = expect_mapping(body.get("breaker"), body.at("breaker"), f"{what} breaker")
    check_keys(breaker_map, {"failures", "cooldown"}, f"{what} breaker")
    breaker = Breaker(
        expect_int(
            breaker_map.get("failures", 5),
            breaker_map.at("failures"),
            f"{what} breaker.failures",
            minimum=1,
            maximum=10000,
        ),
        parse_duration(breaker_map.get("cooldown", "30s"), breaker_map.at("cooldown"), f"{what} breaker.cooldown"),
    )
    return EndpointConfig(partner, name, kind.kind, transport, concurrency, rate, attempts, max_age, backoff, breaker)


def parse_delivery_section(section: MarkedDict) -> AddressPolicy:
    """The main configuration's ``delivery:`` section: the address lists every endpoint is held to."""
    check_keys(section, {"allow_addresses", "deny_addresses"}, "delivery")
    return parse_policy(section, "delivery.")
