"""The ``https`` endpoint kind: one POST per attempt, signed the Standard Webhooks way.

Everything an attempt does is bounded: the whole attempt by the endpoint's ``timeout`` (DNS, connection,
TLS, request and answer), the answer's body by ``max_response_bytes`` (the rest is never read), redirects
not followed unless ``redirects: same-origin`` (then at most three, to the same scheme, host and port), and
the address by the endpoint's :class:`~gateway.delivery.addresses.AddressPolicy`, checked on the address the
host resolved to for this attempt, which is the one connected to.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import ssl
import time
from dataclasses import dataclass, field
from typing import ClassVar
from urllib.parse import urljoin, urlsplit

import httpx

from gateway.delivery.addresses import AddressPolicy, parse_policy
from gateway.delivery.errors import BlockedAddressError
from gateway.delivery.signing import parse_secret, signature_headers
from gateway.delivery.transport import AttemptResult, OutboundRequest, register_transport
from gateway.errors import clip
from gateway.marked import (
    MarkedDict,
    Where,
    check_keys,
    expect_choice,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
    parse_duration,
)

__all__ = [
    "HttpsEndpoint",
    "HttpsTransport",
    "attempt_failure",
    "classify",
    "parse_https_endpoint",
    "post_checked",
    "retry_after_seconds",
]

KEYS = {
    "url",
    "timeout",
    "connect_timeout",
    "ca_bundle",
    "client_cert",
    "client_key",
    "headers",
    "secrets",
    "redirects",
    "max_response_bytes",
    "allow_addresses",
    "deny_addresses",
}
_HOP_HEADERS = {
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
}
MAX_REDIRECTS = 3
USER_AGENT = "b2bgw-delivery/1"


@dataclass(frozen=True, slots=True)
class HttpsEndpoint:
    """The ``https`` part of an endpoint's configuration."""

    url: str
    timeout: float = 30.0
    connect_timeout: float = 10.0
    ca_bundle: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    secrets: tuple[bytes, ...] = field(default=(), repr=False)
    redirects: str = "none"
    max_response_bytes: int = 65536
    addresses: AddressPolicy = field(default_factory=AddressPolicy)


def _secret_text(value: object, where: Where, what: str) -> str:
    text = expect_str(value, where, what)
    if text.startswith("env:"):
        name = text[4:]
        found = os.environ.get(name)
        if not found:
            raise where.error(f"{what} names the environment variable {name!r}, which is not set")
        return found
    return text


def _path(body: MarkedDict, key: str, what: str) -> str | None:
    if key not in body:
        return None
    value = expect_str(body[key], body.at(key), f"{what} {key}")
    if not os.path.isfile(value):
        raise body.at(key).error(f"{what} {key}: no such file {clip(value, 200)!r}")
    return value


def parse_https_endpoint(body: MarkedDict, where: Where, what: str) -> HttpsEndpoint:
    """Check an ``https`` endpoint's own keys (ConfigError with file and line)."""
    check_keys(body, KEYS | {"kind"}, what)
    url = expect_str(body.get("url"), body.at("url"), f"{what} url")
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.hostname or parts.username or parts.password:
        raise body.at("url").error(
            f"{what} url must be an https:// URL with a host and no credentials; got {clip(url, 120)!r}"
        )
    timeout = parse_duration(body.get("timeout", "30s"), body.at("timeout"), f"{what} timeout")
    connect = parse_duration(body.get("connect_timeout", "10s"), body.at("connect_timeout"), f"{what} connect_timeout")
    if not 0 < timeout <= 600 or not 0 < connect <= 600:
        raise body.at("timeout").error(f"{what} timeout and connect_timeout must be more than 0 and at most 10m")
    headers_map = expect_mapping(body.get("headers"), body.at("headers"), f"{what} headers")
    headers = []
    for name, value in headers_map.items():
        if not isinstance(name, str) or not name.isascii() or not name.replace("-", "").isalnum():
            raise headers_map.at(name).error(f"{what} headers: {clip(repr(name), 60)} is not a header name")
        if name.lower() in _HOP_HEADERS:
            raise headers_map.at(name).error(f"{what} headers: {name} is set by the gateway itself")
        if not isinstance(value, (str, int)) or "\n" in str(value) or "\r" in str(value):
            raise headers_map.at(name).error(f"{what} headers: the value of {name} must be one line of text")
        headers.append((name, str(value)))
    secret_list = body.get("secrets")
    if isinstance(secret_list, str):
        secret_list = [secret_list]
    items = expect_list(secret_list, body.at("secrets"), f"{what} secrets")
    secrets = tuple(
        parse_secret(_secret_text(item, items.at(i), f"{what} secrets[{i}]"), items.at(i), f"{what} secrets[{i}]")
        for i, item in enumerate(items)
    )
    if not secrets:
        raise body.where.error(
            f"{what}: secrets must list at least one signing secret (whsec_...), so the "
            "partner can tell our deliveries from anyone else's"
        )
    redirects = expect_choice(
        body.get("redirects", "none"), body.at("redirects"), f"{what} redirects", ("none", "same-origin")
    )
    max_body = expect_int(
        body.get("max_response_bytes", 65536),
        body.at("max_response_bytes"),
        f"{what} max_response_bytes",
        minimum=0,
        maximum=16 * 1024 * 1024,
    )
    cert, key = _path(body, "client_cert", what), _path(body, "client_key", what)
    if key and not cert:
        raise body.at("client_key").error(f"{what}: client_key needs client_cert")
    endpoint = HttpsEndpoint(
        url,
        timeout,
        connect,
        _path(body, "ca_bundle", what),
        cert,
        key,
        tuple(headers),
        secrets,
        redirects,
        max_body,
        parse_policy(body, f"{what} "),
    )
    try:
        _ssl_context(endpoint)
    except (OSError, ssl.SSLError) as exc:
        raise body.where.error(
            f"{what}: the CA bundle or client certificate does not load: {clip(str(exc), 200)}"
        ) from None
    return endpoint


def _ssl_context(endpoint: HttpsEndpoint) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=endpoint.ca_bundle)
    if endpoint.client_cert:
        context.load_cert_chain(endpoint.client_cert, endpoint.client_key)
    return context


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delta-seconds or an HTTP date), None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(min(int(value), 86400))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, min(86400.0, when.timestamp() - (time.time() if now is None else now)))


def classify(status: int) -> str:
    """The outcome an HTTP status means: 2xx delivered; 408, 409, 429 and 5xx retried; other answers failed."""
    if 200 <= status < 300:
        return "delivered"
    if status in (408, 409, 429) or status >= 500:
        return "retry"
    return "failed"


class HttpsTransport:
    """One endpoint's clients: one per attempt in progress, each with one connection kept alive between the
    attempts it makes (a pool of one is never searched, and a free client is found by a list's pop)."""

    kind: ClassVar[str] = "https"

    def __init__(self, endpoint: HttpsEndpoint) -> None:
        self.endpoint = endpoint
        self._context = _ssl_context(endpoint)
        self._idle: list[httpx.AsyncClient] = []
        self._clients: list[httpx.AsyncClient] = []

    def _client(self) -> httpx.AsyncClient:
        if self._idle:
            return self._idle.pop()
        client = httpx.AsyncClient(
            verify=self._context,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(self.endpoint.timeout, connect=self.endpoint.connect_timeout),
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        )
        self._clients.append(client)
        return client

    async def aclose(self) -> None:
        clients, self._clients, self._idle = self._clients, [], []
        for client in clients:
            await client.aclose()

    async def send(self, request: OutboundRequest) -> AttemptResult:
        client = self._client()
        try:
            async with asyncio.timeout(request.timeout):
                return await self._send(client, request)
        except (TimeoutError, BlockedAddressError, httpx.HTTPError, OSError) as exc:
            return attempt_failure(exc, request.timeout)
        finally:
            self._idle.append(client)

    async def _send(self, client: httpx.AsyncClient, request: OutboundRequest) -> AttemptResult:
        url = self.endpoint.url
        headers = {
            "content-type": request.content_type,
            "user-agent": USER_AGENT,
            **dict(self.endpoint.headers),
            **signature_headers(self.endpoint.secrets, request.delivery_id, request.body),
        }
        for _hop in range(MAX_REDIRECTS + 1):
            status, location, retry_after, text = await self._post(client, url, headers, request.body)
            if 300 <= status < 400 and location:
                target = urljoin(url, location)
                if self.endpoint.redirects == "same-origin" and _origin(target) == _origin(url):
                    url = target
                    continue
                return AttemptResult(
                    "failed",
                    status,
                    clip(f"{status} redirect to {target} not followed (redirects: {self.endpoint.redirects})", 300),
                )
            outcome = classify(status)
            detail = f"{status}" + (f": {text}" if text else "")
            honoured = retry_after if status in (429, 503) else None
            return AttemptResult(outcome, status, clip(detail, 300), honoured)  # type: ignore[arg-type]
        return AttemptResult("failed", None, f"more than {MAX_REDIRECTS} redirects")

    async def _post(
        self, client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str | None, float | None, str]:
        return await post_checked(client, url, headers, body, self.endpoint.addresses, self.endpoint.max_response_bytes)


async def post_checked(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: bytes,
    addresses: AddressPolicy,
    max_response_bytes: int,
) -> tuple[int, str | None, float | None, str]:
    """POST *body* to the address *url*'s host resolves to now, once *addresses* allowed it (the name kept for
    TLS and ``Host``); returns the status, ``Location``, ``Retry-After`` and the start of the answer's body.

    Raises :class:`BlockedAddressError` before connecting to an address the policy refuses."""
    target, host_header, extensions = await addresses.pin(url)
    request = client.build_request(
        "POST", target, content=body, headers={**headers, "host": host_header}, extensions=extensions
    )
    response = await client.send(request, stream=True)
    try:
        text = await _read_bounded(response, max_response_bytes)
    finally:
        await response.aclose()
    return (
        response.status_code,
        response.headers.get("location"),
        retry_after_seconds(response.headers.get("retry-after")),
        text,
    )


async def _read_bounded(response: httpx.Response, limit: int) -> str:
    """Up to *limit* bytes of the answer's body (as one line of text); the rest is not read."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        chunks.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    data = b"".join(chunks)[:limit]
    return " ".join(data[:200].decode("utf-8", "replace").split())


def attempt_failure(
    exc: TimeoutError | BlockedAddressError | httpx.HTTPError | OSError, timeout: float
) -> AttemptResult:
    """The attempt an exception of one POST means: a blocked address is permanent, a timeout or a network error
    is retried."""
    if isinstance(exc, TimeoutError):
        return AttemptResult("retry", None, f"no answer within {timeout:g} s")
    if isinstance(exc, BlockedAddressError):
        return AttemptResult("failed", None, exc.detail)
    if isinstance(exc, httpx.HTTPError):
        return AttemptResult(
            "retry", None, clip(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, 300)
        )
    return AttemptResult("retry", None, clip(f"network error: {exc}", 300))


def _origin(url: str) -> tuple[str, str | None, int]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


register_transport("https", parse_https_endpoint, HttpsTransport)
