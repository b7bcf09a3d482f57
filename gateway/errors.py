"""The one error hierarchy of the gateway.

Every error the gateway raises on purpose derives from :class:`GatewayError`. Each class carries the HTTP
``status`` it maps to, a short stable machine ``code`` (what a partner's software switches on) and a human
``detail`` that says what to do about it. The classes below go by status: the document's own faults (413,
415, and 400 under :class:`InvalidDocumentError`, which carries the ``errors`` found: not well-formed,
forbidden XML and the intake limits, schema, business rules), the request's (400 headers, 401, 403, 404,
405), idempotency and retention (409, 410), routing and rules (422), rate limits (429 under
:class:`TooManyRequestsError`, with ``retry_after``), the back end, the store and the load (502, 503, 504), and
:class:`ConfigError` for the operator. docs/partner-guide.md lists every code a partner can see.

Whatever a client sends is under its control, size included, so everything these errors can return to it is
bounded: ``detail`` is clipped to :data:`MAX_DETAIL_CHARS`, each :class:`XMLErrorDetail` message and path to
:data:`MAX_MESSAGE_CHARS` / :data:`MAX_PATH_CHARS`, and an :class:`InvalidDocumentError` keeps at most
``max_errors`` entries (the rest only counted, in ``omitted``). Nothing here ever quotes the content of an
entity or of an external file: the intake never expands or loads one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "MAX_DETAIL_CHARS",
    "MAX_MESSAGE_CHARS",
    "MAX_PATH_CHARS",
    "XMLErrorDetail",
    "GatewayError",
    "DocumentTooLargeError",
    "UnsupportedMediaTypeError",
    "InvalidDocumentError",
    "NotWellFormedError",
    "XMLSecurityError",
    "IntakeLimitError",
    "TooManyAttributesError",
    "TooManyNamespacesError",
    "TooManyDocumentNamespacesError",
    "NameTooLongError",
    "TextTooLongError",
    "SchemaValidationError",
    "RuleFailureDetail",
    "BusinessRuleViolationError",
    "RulesTimeoutError",
    "RulesEvaluationError",
    "InvalidHeaderError",
    "AuthenticationError",
    "AuthenticationBusyError",
    "AuthenticationThrottledError",
    "ForbiddenRouteError",
    "NotFoundError",
    "MethodNotAllowedError",
    "IdempotencyConflictError",
    "ArchivedReplayError",
    "DocumentArchivedError",
    "NoRouteError",
    "TooManyRequestsError",
    "RateLimitedError",
    "ConcurrencyLimitedError",
    "BackendError",
    "StoreUnavailableError",
    "GatewayBusyError",
    "ReplyTimeoutError",
    "ConfigError",
    "UnknownSchemaError",
    "clip",
]

#: Longest ``detail`` an error keeps (characters).
MAX_DETAIL_CHARS = 500
#: Longest message of one :class:`XMLErrorDetail` (characters).
MAX_MESSAGE_CHARS = 300
#: Longest element path of one :class:`XMLErrorDetail`; longer ones keep their end.
MAX_PATH_CHARS = 512

_ELLIPSIS = "\u2026"


def clip(text: str, limit: int) -> str:
    """Return *text* cut to at most *limit* characters, marking the cut with an ellipsis."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + _ELLIPSIS


def _clip_head(text: str, limit: int) -> str:
    """Like :func:`clip` but keeps the end (the specific part of a path)."""
    if len(text) <= limit:
        return text
    return _ELLIPSIS + text[len(text) - max(limit - 1, 0) :]


@dataclass(frozen=True, slots=True)
class XMLErrorDetail:
    """One problem found in a document.

    ``line`` and ``column`` are 1-based positions in the document as received
    (``None`` when unknown), ``path`` an XPath-like location of the element
    with the document's own prefixes and a position where siblings share a
    name (``/Order/cac:OrderLine[2]/cbc:Quantity``; ``None`` before there is a
    tree), ``message`` what is wrong. Message and path are clipped on
    construction, so a detail is always small.
    """

    line: int | None
    column: int | None
    path: str | None
    message: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", clip(str(self.message), MAX_MESSAGE_CHARS))
        if self.path is not None:
            object.__setattr__(self, "path", _clip_head(str(self.path), MAX_PATH_CHARS))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict with the four fields."""
        return {"line": self.line, "column": self.column, "path": self.path, "message": self.message}

    def __str__(self) -> str:
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.column is not None:
            where.append(f"column {self.column}")
        if self.path:
            where.append(self.path)
        return f"{', '.join(where)}: {self.message}" if where else self.message


class GatewayError(Exception):
    """Base of every error raised by the gateway; also the 500 for a bug."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal-error"
    #: False for the errors only the operators' side answers: the partner API's OpenAPI document leaves them out
    partner_facing: ClassVar[bool] = True
    default_detail: ClassVar[str] = "The gateway failed to process the request; retry later or contact the operator."

    def __init__(self, detail: str | None = None) -> None:
        self.detail = clip(detail if detail else self.default_detail, MAX_DETAIL_CHARS)
        super().__init__(self.detail)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON-ready body of the error response."""
        return {"status": self.status, "code": self.code, "detail": self.detail}

    def __str__(self) -> str:
        return self.detail

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, code={self.code!r}, detail={self.detail!r})"


class DocumentTooLargeError(GatewayError):
    """Raised when a request body is larger than the configured limit: as
    soon as the running size read from the stream passes it (or when the
    declared ``Content-Length`` already does). ``limit`` is that limit."""

    status = 413
    code = "document-too-large"
    default_detail = "The document is larger than this gateway accepts; split it or send it compressed by agreement."

    def __init__(self, detail: str | None = None, *, limit: int | None = None) -> None:
        self.limit = limit
        if detail is None and limit is not None:
            detail = f"The document is larger than the {limit} bytes this gateway accepts; send a smaller document."
        super().__init__(detail)


class UnsupportedMediaTypeError(GatewayError):
    """Raised when the request's ``Content-Type`` is missing or is not an XML
    media type (``application/xml``, ``text/xml``, ``application/*+xml``), or
    names a charset the gateway does not decode. ``received`` is the
    (clipped) header value."""

    status = 415
    code = "unsupported-media-type"
    default_detail = "Send the document with Content-Type application/xml."

    def __init__(self, detail: str | None = None, *, received: str | None = None) -> None:
        self.received = None if received is None else clip(received, 100)
        super().__init__(detail)


class InvalidDocumentError(GatewayError):
    """Base of the errors about the document itself; ``errors`` lists the
    problems (at most ``max_errors``; ``omitted`` counts those left out)."""

    status = 400
    code = "invalid-document"
    default_detail = "The document was rejected; see errors."
    max_errors: ClassVar[int] = 50

    def __init__(
        self,
        detail: str | None = None,
        errors: Iterable[XMLErrorDetail] = (),
        *,
        omitted: int = 0,
    ) -> None:
        kept: list[XMLErrorDetail] = []
        extra = 0
        for err in errors:
            if len(kept) < self.max_errors:
                kept.append(err)
            else:
                extra += 1
        self.errors: list[XMLErrorDetail] = kept
        self.omitted = omitted + extra
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        body["errors"] = [e.to_dict() for e in self.errors]
        if self.omitted:
            body["omitted_errors"] = self.omitted
        return body

    def __str__(self) -> str:
        if not self.errors:
            return self.detail
        more = len(self.errors) - 1 + self.omitted
        tail = f" (+{more} more)" if more else ""
        return f"{self.detail} [{self.errors[0]}]{tail}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, detail={self.detail!r}, "
            f"errors={self.errors!r}, omitted={self.omitted})"
        )


class NotWellFormedError(InvalidDocumentError):
    """Raised when the body is not well-formed XML: a syntax error (each with
    the line and column the parser reports), an empty body, bytes that do not
    decode in the document's encoding, an unsupported encoding, or an HTTP
    ``charset`` / byte order mark that conflicts with the XML declaration."""

    code = "not-well-formed"
    default_detail = "The document is not well-formed XML; fix the errors listed and send it again."
    max_errors = 20


class XMLSecurityError(InvalidDocumentError):
    """Raised when the document uses a construct the gateway refuses for
    safety: any DOCTYPE (internal or external DTD, entity declarations),
    entity references other than the predefined five, nesting deeper than the
    limit, more elements than the limit, or another parser resource limit.
    Its messages are fixed texts: it never quotes entity content."""

    code = "forbidden-xml"
    default_detail = "The document uses an XML construct this gateway refuses for safety."
    max_errors = 20


class IntakeLimitError(XMLSecurityError):
    """Base of the errors raised when a document passes one of the configured intake limits (the
    ``limits:`` section): ``limit`` is the key (``max_attributes``...), ``limit_value`` its configured
    value. The detail names both and never quotes the document."""

    code = "limit-exceeded"
    default_detail = "The document passes one of this gateway's intake limits."

    def __init__(
        self,
        detail: str | None = None,
        errors: Iterable[XMLErrorDetail] = (),
        *,
        limit: str | None = None,
        limit_value: int | None = None,
    ) -> None:
        self.limit = limit
        self.limit_value = limit_value
        super().__init__(detail, errors)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        if self.limit is not None:
            body["limit"] = self.limit
            body["limit_value"] = self.limit_value
        return body


class TooManyAttributesError(IntakeLimitError):
    """Raised when an element carries more attributes (namespace declarations not counted) than
    ``limits.max_attributes`` allows (the JDK's ``jdk.xml.elementAttributeLimit``)."""

    code = "too-many-attributes"
    default_detail = "An element has more attributes than this gateway accepts."


class TooManyNamespacesError(IntakeLimitError):
    """Raised when one element declares more namespaces (``xmlns`` / ``xmlns:p`` attributes) than
    ``limits.max_namespaces_per_element`` allows."""

    code = "too-many-namespaces"
    default_detail = "An element declares more namespaces than this gateway accepts."


class TooManyDocumentNamespacesError(IntakeLimitError):
    """Raised when the document as a whole declares more namespaces (counting every ``xmlns``
    attribute of every element) than ``limits.max_namespaces_per_document`` allows."""

    code = "too-many-document-namespaces"
    default_detail = "The document declares more namespaces than this gateway accepts."


class NameTooLongError(IntakeLimitError):
    """Raised when an element or attribute name (prefix included) or a namespace URI is longer than
    ``limits.max_name_length`` characters (the JDK's ``jdk.xml.maxXMLNameLimit``)."""

    code = "name-too-long"
    default_detail = "A name in the document is longer than this gateway accepts."


class TextTooLongError(IntakeLimitError):
    """Raised when a text node (CDATA sections included) or an attribute value is longer than
    ``limits.max_text_length`` characters."""

    code = "text-too-long"
    default_detail = "A text or attribute value in the document is longer than this gateway accepts."


class SchemaValidationError(InvalidDocumentError):
    """Raised when a well-formed document does not validate against the schema
    of its type: each error has the line, column, element path and message.
    ``schema`` is the name of the schema it was checked against."""

    code = "schema-invalid"
    default_detail = "The document is not valid against its schema; fix the errors listed and send it again."
    max_errors = 50

    def __init__(
        self,
        detail: str | None = None,
        errors: Iterable[XMLErrorDetail] = (),
        *,
        omitted: int = 0,
        schema: str | None = None,
    ) -> None:
        self.schema = schema
        super().__init__(detail, errors, omitted=omitted)


@dataclass(frozen=True, slots=True)
class RuleFailureDetail:
    """One business rule a document breaks: the rule's ``id`` and ``flag`` as its rule set gives them, the
    ``location`` (XPath) of the node it was checked on, the rule's ``text``, and the ``line`` and
    ``column`` of that node in the document as received when it can be located. Text and location are
    clipped on construction."""

    id: str | None
    flag: str | None
    location: str
    text: str
    line: int | None = None
    column: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", clip(str(self.text), MAX_MESSAGE_CHARS))
        object.__setattr__(self, "location", _clip_head(str(self.location), MAX_PATH_CHARS))
        if self.id is not None:
            object.__setattr__(self, "id", clip(str(self.id), 100))
        if self.flag is not None:
            object.__setattr__(self, "flag", clip(str(self.flag), 40))

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict: id, flag, location, text, line, column."""
        return {
            "id": self.id,
            "flag": self.flag,
            "location": self.location,
            "text": self.text,
            "line": self.line,
            "column": self.column,
        }

    def __str__(self) -> str:
        where = f"line {self.line}, " if self.line is not None else ""
        return f"{where}{self.location}: {self.id + ' ' if self.id else ''}{self.text}"


class BusinessRuleViolationError(InvalidDocumentError):
    """Raised when a schema-valid document breaks a business rule its route applies (a Schematron
    assertion of flag ``fatal``, ``error`` or none): ``errors`` lists every such failure as a
    :class:`RuleFailureDetail` (at most ``max_errors``; ``omitted`` counts the rest)."""

    code = "business-rule-violation"
    default_detail = "The document breaks business rules agreed for this route; fix the errors listed and resend it."
    max_errors = 50


class InvalidHeaderError(GatewayError):
    """Raised when a request header the gateway reads is malformed (an
    ``Idempotency-Key`` or ``X-Correlation-ID`` that is too long or holds
    characters outside printable ASCII). ``header`` names it."""

    status = 400
    code = "invalid-header"
    default_detail = "A request header is malformed."

    def __init__(self, detail: str | None = None, *, header: str | None = None) -> None:
        self.header = header
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        if self.header:
            body["header"] = self.header
        return body


class AuthenticationError(GatewayError):
    """Raised when a request carries no credentials, or credentials the
    gateway does not accept."""

    status = 401
    code = "unauthenticated"
    default_detail = "Authenticate with the credentials agreed for your partner account."


class ForbiddenRouteError(GatewayError):
    """Raised when an authenticated partner sends a document over a route
    (endpoint, document type) it is not allowed to use."""

    status = 403
    code = "forbidden-route"
    default_detail = "Your partner account may not send this document type here."


class NotFoundError(GatewayError):
    """Raised for a path that does not exist, and for a document that does
    not exist *or belongs to another partner* (the two are never told apart)."""

    status = 404
    code = "not-found"
    default_detail = "There is nothing at this address."


class MethodNotAllowedError(GatewayError):
    """Raised for an HTTP method a path does not serve; ``allowed`` lists
    the methods it does."""

    status = 405
    code = "method-not-allowed"
    default_detail = "This method is not allowed here."

    def __init__(self, detail: str | None = None, *, allowed: Iterable[str] = ()) -> None:
        self.allowed = tuple(allowed)
        super().__init__(detail)


class IdempotencyConflictError(GatewayError):
    """Raised when a document's idempotency key (its ``Idempotency-Key``, or
    the default key: document type, sender party and document id) was taken
    by a document that was accepted before and differs from this one: this
    one is not accepted, and the first one's answer is not given.
    ``first_message_id`` and ``first_status_url`` name the first document
    (the problem's ``message_id`` and ``status_url`` members)."""

    status = 409
    code = "idempotency-conflict"
    default_detail = (
        "Another document was accepted before under the same idempotency key; this one was not "
        "accepted. Give a new document its own document id or Idempotency-Key."
    )

    def __init__(
        self, detail: str | None = None, *, first_message_id: str | None = None, first_status_url: str | None = None
    ) -> None:
        self.first_message_id = first_message_id
        self.first_status_url = first_status_url
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        if self.first_message_id is not None:
            body["message_id"] = self.first_message_id
        if self.first_status_url is not None:
            body["status_url"] = self.first_status_url
        return body


class _PurgedDocumentError(GatewayError):
    """An error about a document retention took out of the ledger: ``message_id``, ``status_url``,
    ``received_at`` and ``archived_at`` (ISO 8601 UTC; when it left the ledger) are problem members."""

    def __init__(
        self, detail: str | None = None, *, message_id: str, status_url: str, received_at: str, archived_at: str
    ) -> None:
        self.message_id = message_id
        self.status_url = status_url
        self.received_at = received_at
        self.archived_at = archived_at
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        body.update(
            message_id=self.message_id,
            status_url=self.status_url,
            received_at=self.received_at,
            archived_at=self.archived_at,
        )
        return body


class ArchivedReplayError(_PurgedDocumentError):
    """Raised when a document is posted under an idempotency key that the tombstone of a document retention
    already archived (or purged) holds: this one is not accepted, whether it is the same document again or
    another one (no original answer is online to replay; ``message_id`` names the first document)."""

    status = 409
    code = "archived-replay"
    default_detail = (
        "A document was accepted before under the same idempotency key and has been archived since; "
        "this one was not accepted."
    )


class DocumentArchivedError(_PurgedDocumentError):
    """Raised for ``GET`` of one of the partner's own documents that retention has archived (or purged) from
    the ledger: it is not lost, it is no longer online (another partner gets :class:`NotFoundError`)."""

    status = 410
    code = "document-archived"
    default_detail = "This document was archived and is no longer online."


class NoRouteError(GatewayError):
    """Raised when a valid document matches no configured route (no route for
    its partner, document type, or the route's conditions)."""

    status = 422
    code = "no-route"
    default_detail = "No route accepts this document; check the document type and its routing fields."


class RulesTimeoutError(GatewayError):
    """Raised when a document's business rules used up the gateway's time budget without finishing
    (``limits.rules_seconds`` of processor time, the ``seconds`` here): the work was stopped and nothing was
    accepted. The document is the cause: the same document gets the same answer."""

    status = 422
    code = "rules-timeout"
    default_detail = "The business rules took too long on this document; send a smaller document."

    def __init__(self, detail: str | None = None, *, seconds: float | None = None) -> None:
        self.seconds = seconds
        if detail is None and seconds is not None:
            detail = (
                f"The business rules did not finish within {seconds:g} s on this document, the most this "
                "gateway spends on one; nothing was accepted. Send a smaller document (fewer lines)."
            )
        super().__init__(detail)


class RulesEvaluationError(GatewayError):
    """Raised when a document's business rules could not be evaluated on it: a rule raised an XPath
    error on the document's values (a cast of a value that is not a number, say), or the process running
    the rules failed. Nothing was accepted."""

    status = 422
    code = "rules-error"
    default_detail = "The business rules could not be evaluated on this document; check its values."


class _RetryLaterError(GatewayError):
    """An answer that tells the client when to retry: ``retry_after`` seconds (also the ``Retry-After``
    header)."""

    default_retry_after: ClassVar[int] = 1

    def __init__(self, detail: str | None = None, *, retry_after: int | None = None) -> None:
        self.retry_after = max(1, int(self.default_retry_after if retry_after is None else retry_after))
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        body["retry_after"] = self.retry_after
        return body


class TooManyRequestsError(_RetryLaterError):
    """Base of the 429 answers: the partner is over one of its request limits; ``retry_after`` is
    the number of seconds after which a retry may succeed (the ``Retry-After`` header)."""

    status = 429
    code = "too-many-requests"
    default_detail = "Too many requests from your partner account; retry later."


class RateLimitedError(TooManyRequestsError):
    """Raised when a partner sends requests faster than its configured rate
    (``limits.requests_per_second`` with ``limits.burst`` in partners.yaml); nothing of the request
    was read or done."""

    code = "rate-limited"
    default_detail = "Your partner account sends requests faster than agreed; slow down and retry later."


class ConcurrencyLimitedError(TooManyRequestsError):
    """Raised when a partner already has as many requests in progress as its configured
    ``limits.concurrent_requests`` allows; nothing of the request was read or done."""

    code = "too-many-concurrent-requests"
    default_detail = "Your partner account has too many requests in progress; wait for their answers and retry."


class AuthenticationThrottledError(TooManyRequestsError):
    """Raised when a client address sent too many requests whose credentials failed lately: refused
    before any credential is checked, until ``retry_after`` seconds have passed."""

    code = "authentication-throttled"
    default_detail = "Too many failed authentications from your address; check your API key and retry later."


class AuthenticationBusyError(_RetryLaterError):
    """Raised when the checks of API keys not yet verified are queued up to their bound (or the key
    checks cannot start yet): nothing was read or done; retry after ``retry_after`` seconds."""

    status = 503
    code = "authentication-busy"
    default_detail = "The gateway cannot check your API key now; nothing was accepted. Retry later."


class _AcceptedDocumentError(GatewayError):
    """An error about a document that *was* accepted (stored, enqueued):
    carries its ``message_id``, ``correlation_id`` and ``status_url`` so the
    client can follow it up instead of resending."""

    def __init__(
        self,
        detail: str | None = None,
        *,
        message_id: str | None = None,
        correlation_id: str | None = None,
        status_url: str | None = None,
    ) -> None:
        self.message_id = message_id
        self.correlation_id = correlation_id
        self.status_url = status_url
        super().__init__(detail)

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        for name in ("message_id", "correlation_id", "status_url"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


class BackendError(_AcceptedDocumentError):
    """Raised when the back end answered a request-reply document with an
    error (a reply carrying the ``B2BError`` property) instead of a business
    reply. The document was accepted; its ledger status is ``failed``.
    ``message_id`` and ``correlation_id`` identify it."""

    status = 502
    code = "backend-error"
    default_detail = "The back end could not process the document; contact the operator before resending."


class StoreUnavailableError(GatewayError):
    """Raised when the message store (the database) cannot be reached or did
    not take the write: nothing of the request took effect, retry later."""

    status = 503
    code = "store-unavailable"
    default_detail = "The gateway's store is unavailable; nothing was accepted, retry later."


class GatewayBusyError(_RetryLaterError):
    """Raised when a helper process (the business rules, a large document's intake) did not finish a
    document's work in time because the machine was overloaded, not because of the document: the work had
    not spent its budget of processor time when the longest wait for it was up. Nothing was accepted; the
    same document may be sent again after ``retry_after`` seconds (the ``Retry-After`` header)."""

    status = 503
    code = "gateway-busy"
    default_detail = "The gateway is too busy to finish this document now; nothing was accepted. Send it again later."
    default_retry_after = 5


class ReplyTimeoutError(_AcceptedDocumentError, TimeoutError):
    """Raised when a synchronous exchange got no reply from the back end in
    time; the document may still be processed. ``message_id``,
    ``correlation_id`` and ``status_url`` (when known) tell the client where
    to look for the reply later."""

    status = 504
    code = "reply-timeout"
    default_detail = "No reply arrived in time; the document may still be processed, query its status before resending."


class ConfigError(GatewayError):
    """Raised when a configuration or route file, or a schema it names, is
    wrong: unreadable, invalid, naming something unknown, or a schema that
    does not compile. ``file`` and ``line`` locate it when known."""

    status = 500
    code = "config-error"
    default_detail = "The gateway configuration is invalid."

    def __init__(self, detail: str | None = None, *, file: str | None = None, line: int | None = None) -> None:
        self.file = None if file is None else str(file)
        self.line = line
        super().__init__(detail)

    def __str__(self) -> str:
        if self.file is None:
            return self.detail
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.detail}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, detail={self.detail!r}, "
            f"file={self.file!r}, line={self.line!r})"
        )


class UnknownSchemaError(ConfigError):
    """Raised when a schema name is asked for that is not registered (a route
    or the startup configuration names a schema the registry does not have)."""

    code = "unknown-schema"
    default_detail = "The schema asked for is not registered."
