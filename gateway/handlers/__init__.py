"""Message handlers: consume documents from the broker and reply, exactly once.

A backend developer writes ``fn(message, context)``, plain or ``async def``, and declares with
:func:`handler` where its messages come from; a :class:`Worker` runs the handlers of a registry
(docs/handlers.md and docs/backend-guide.md are the guides). What the worker guarantees:

* Each handler gets its own connection and ``concurrency`` transacted sessions: a thread each for a plain
  function, a task each on the worker's event loop for an ``async def``.
* The request, the reply and whatever the handler sends through ``context`` commit in one transaction: a
  crash or an exception before the commit sends nothing and redelivers the request, which the broker
  dead-letters after its ``max_deliveries``.
* :class:`Reject` (raised or returned) dead-letters a request that can never be processed at once, without
  redelivery. :class:`BusinessError` answers an error reply (``B2BError``, ``B2BErrorCode``, an optional
  body: the gateway answers the partner ``502 backend-error``) and commits.
* The reply goes to ``jms_reply_to`` with ``reply_correlation_id(request)`` and, unless the handler set one,
  ``jms_type`` = its root element's local name. Without ``jms_reply_to``, or when the requester's temporary
  queue is gone, the request commits without the reply, so that it is not redelivered for ever.

:mod:`gateway.testing` runs a handler with this same code in a test's own thread or event loop.
"""

from __future__ import annotations

from gateway.handlers.api import (
    ERROR_CODE_PROPERTY,
    ERROR_PROPERTY,
    AsyncHandlerContext,
    BusinessError,
    Handler,  # noqa: F401 (the registry's entries: importable, not part of the face)
    HandlerContext,
    HandlerRegistry,  # noqa: F401
    Reject,
    Reply,
    SendOptions,
    handler,
    registry,
)
from gateway.handlers.worker import HandlerStats, Worker

__all__ = [
    "AsyncHandlerContext",
    "BusinessError",
    "ERROR_CODE_PROPERTY",
    "ERROR_PROPERTY",
    "HandlerContext",
    "HandlerStats",
    "Reject",
    "Reply",
    "SendOptions",
    "Worker",
    "handler",
    "registry",
]
