"""The transport plug-in interface: how the engine hands one attempt to an endpoint's kind.

The engine owns everything around an attempt (retries, backoff, the circuit breaker, ordering, the rate
limit, the queues and the ledger); a transport only makes one attempt and says how it went. Endpoint kinds
(``https``, ``as2``, ...) are looked up in the registry below, so a new kind registers itself and needs no
change to the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from gateway.marked import MarkedDict, Where

__all__ = [
    "AttemptResult",
    "OutboundRequest",
    "Transport",
    "TransportKind",
    "known_kinds",
    "register_transport",
    "transport_kind",
]


@dataclass(frozen=True, slots=True)
class OutboundRequest:
    """What the engine hands a transport for one attempt."""

    delivery_id: str  # stable across attempts (the webhook-id; AS2 derives its Message-ID from it)
    partner: str  # the receiving partner's name
    endpoint: str  # the endpoint's name within that partner
    body: bytes  # the document (after any XSLT)
    content_type: str  # e.g. "application/xml"
    attempt: int  # 1-based
    timeout: float  # seconds this attempt may take in all
    #: where this delivery goes when the delivery itself says (an AS2 MDN's Receipt-Delivery-Option URL);
    #: None for the endpoint's own address. The kind checks it on every attempt: it may be a partner's input.
    target: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How one attempt went; ``failed`` is permanent and sends the delivery to the dead-letter lane."""

    outcome: Literal["delivered", "retry", "failed"]
    status: int | None = None  # the HTTP status, when one came back
    detail: str = ""  # one line for the timeline and the operators
    retry_after: float | None = None  # seconds, from Retry-After
    evidence: bytes | None = None  # what proves delivery (an AS2 MDN), kept with the attempt


class Transport(Protocol):
    """One endpoint's way of making an attempt."""

    kind: ClassVar[str]

    async def send(self, request: OutboundRequest) -> AttemptResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TransportKind:
    """A registered kind: how to check an endpoint's YAML and how to make its transport."""

    kind: str
    parse_endpoint: Callable[[MarkedDict, Where, str], Any]
    factory: Callable[[Any], Transport]


_KINDS: dict[str, TransportKind] = {}
_LOCK = threading.Lock()


def register_transport(
    kind: str, parse_endpoint: Callable[[MarkedDict, Where, str], Any], factory: Callable[[Any], Transport]
) -> None:
    """Register an endpoint kind.

    ``parse_endpoint(mapping, where, what)`` checks one endpoint's YAML (keys other than the common ones:
    kind, concurrency, rate_limit, max_attempts, max_age, backoff ...) and returns its config object;
    ``factory(config)`` makes the transport. Registering a kind again replaces it.
    """
    with _LOCK:
        _KINDS[kind] = TransportKind(kind, parse_endpoint, factory)


def transport_kind(kind: str) -> TransportKind | None:
    """The registered kind named *kind*, or None."""
    _load_builtin_kinds()
    return _KINDS.get(kind)


def known_kinds() -> tuple[str, ...]:
    """The names of the registered kinds, sorted."""
    _load_builtin_kinds()
    return tuple(sorted(_KINDS))


def _load_builtin_kinds() -> None:
    """Import the kinds shipped with the gateway, each of which registers itself on import."""
    import importlib

    for module in _BUILTIN:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


_BUILTIN = ("gateway.delivery.https", "gateway.as2.kind")  # loaded by name: a kind plugs into the engine
