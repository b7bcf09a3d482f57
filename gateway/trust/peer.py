"""Who is on the other end of a request: the client certificate and the client address.

A direct TLS connection's certificate is read once per connection (:func:`tls_extension`, called by the
HTTP protocol when the connection is made) and put in the ASGI scope's ``extensions["tls"]`` as the ASGI
TLS extension says (``client_cert_chain``, PEM), with its parsed form beside it. From a peer listed in
``server.trusted_proxies``, :class:`TrustMiddleware` takes instead

* the client address from ``Forwarded`` (RFC 7239) or else ``X-Forwarded-For``: the right-most address
  that is not itself a trusted proxy (what the nearest proxy saw; those further left are whatever the
  client wrote), and the scheme from ``X-Forwarded-Proto`` / ``proto=``;
* the client certificate from nginx's ``X-SSL-Client-Cert`` (``$ssl_client_escaped_cert``: the PEM,
  URL-escaped) or Envoy's ``X-Forwarded-Client-Cert`` (its last element: the nearest proxy's client), as
  ``server.client_cert_header`` says.

From any other peer these headers are ignored: anyone can write them.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import logging
import re
import ssl
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from gateway.trust.settings import TrustSettings

__all__ = ["PeerCertificate", "TrustMiddleware", "client_certificate", "forwarded_client", "tls_extension"]

log = logging.getLogger(__name__)

#: The scope key the parsed client certificate (or None) is kept under.
SCOPE_KEY = "b2bgw.client_cert"
NGINX_HEADER = b"x-ssl-client-cert"
ENVOY_HEADER = b"x-forwarded-client-cert"
#: A forwarded certificate header longer than this is ignored (a chain of a few certificates fits).
MAX_CERT_HEADER = 16 * 1024
_MAX_HOPS = 32


@dataclass(frozen=True, slots=True)
class PeerCertificate:
    """A client certificate: its SHA-256 fingerprint (lower-case hex of the DER), subject and issuer."""

    sha256: str
    subject: x509.Name | None
    issuer: x509.Name | None
    not_after: dt.datetime | None = None

    @classmethod
    def from_der(cls, der: bytes) -> PeerCertificate:
        digest = hashlib.sha256(der).hexdigest()
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            return cls(digest, None, None)
        return cls(digest, cert.subject, cert.issuer, cert.not_valid_after_utc)

    @classmethod
    def from_pem(cls, pem: str) -> PeerCertificate | None:
        try:
            cert = x509.load_pem_x509_certificate(pem.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            return None
        from cryptography.hazmat.primitives.serialization import Encoding

        der = cert.public_bytes(Encoding.DER)
        return cls(hashlib.sha256(der).hexdigest(), cert.subject, cert.issuer, cert.not_valid_after_utc)

    def describe(self) -> str:
        """What logs and the ledger say: the fingerprint (short) and the subject."""
        subject = self.subject.rfc4514_string() if self.subject is not None else "?"
        return f"certificate sha256:{self.sha256[:16]} {subject}"[:200]


def tls_extension(transport: Any) -> dict[str, Any] | None:
    """The ASGI TLS extension of a connection (None for plain TCP), with the client certificate parsed."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    der = ssl_object.getpeercert(binary_form=True)
    peer = PeerCertificate.from_der(der) if der else None
    cipher = ssl_object.cipher()
    return {
        "server_cert": None,
        "client_cert_chain": [ssl.DER_cert_to_PEM_cert(der)] if der else [],
        "client_cert_name": peer.subject.rfc4514_string() if peer is not None and peer.subject else None,
        "client_cert_error": None,
        "tls_version": {"TLSv1.2": 0x0303, "TLSv1.3": 0x0304}.get(ssl_object.version() or ""),
        "cipher_suite": None,
        "b2bgw.cipher": cipher[0] if cipher else None,
        "b2bgw.peer": peer,
    }


def client_certificate(scope: Any) -> PeerCertificate | None:
    """The client certificate of a request: what :class:`TrustMiddleware` decided, else the connection's."""
    if SCOPE_KEY in scope:
        return scope[SCOPE_KEY]
    tls = (scope.get("extensions") or {}).get("tls")
    return tls.get("b2bgw.peer") if tls else None


# ----------------------------------------------------------------------------------------- proxies

_FORWARDED_PAIR = re.compile(r'\s*([A-Za-z]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;,\s]*)\s*')


def _forwarded_elements(value: str) -> list[dict[str, str]]:
    """RFC 7239 ``Forwarded``: a list of elements, each ``{param: value}`` (quoted values unquoted)."""
    out: list[dict[str, str]] = []
    for element in value.split(",")[-_MAX_HOPS:]:
        params: dict[str, str] = {}
        for pair in element.split(";"):
            m = _FORWARDED_PAIR.fullmatch(pair)
            if m:
                raw = m.group(2)
                params[m.group(1).lower()] = raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw
        out.append(params)
    return out


def _node_address(node: str) -> str | None:
    """The IP address of an RFC 7239 node (``192.0.2.1``, ``"[2001:db8::1]:4711"``, ``unknown``: None)."""
    node = node.strip()
    if node.startswith("["):
        node = node[1:].split("]", 1)[0]
    elif node.count(":") == 1:
        node = node.split(":", 1)[0]
    try:
        return str(ipaddress.ip_address(node))
    except ValueError:
        return None


def _trusted(address: str | None, proxies: tuple[Any, ...]) -> bool:
    if address is None:
        return False
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in proxies)


def forwarded_client(headers: dict[bytes, bytes], proxies: tuple[Any, ...]) -> tuple[str | None, str | None]:
    """The client address and scheme that trusted proxies forwarded (None where they say nothing)."""
    hops: list[str | None] = []
    proto = None
    if b"forwarded" in headers:
        elements = _forwarded_elements(headers[b"forwarded"].decode("latin-1"))
        hops = [_node_address(e.get("for", "")) for e in elements]
        proto = elements[-1].get("proto") if elements else None
    elif b"x-forwarded-for" in headers:
        hops = [_node_address(h) for h in headers[b"x-forwarded-for"].decode("latin-1").split(",")[-_MAX_HOPS:]]
        if b"x-forwarded-proto" in headers:
            proto = headers[b"x-forwarded-proto"].decode("latin-1").split(",")[-1].strip()
    client = None
    for hop in reversed(hops):
        client = hop
        if not _trusted(hop, proxies):
            break
    if proto is not None and proto.lower() not in ("http", "https"):
        proto = None
    return client, proto.lower() if proto else None


def _envoy_certificate(value: str) -> PeerCertificate | None:
    """The nearest client's certificate in an ``x-forwarded-client-cert`` value (its last element)."""
    element = value.split(",")[-1]
    fields: dict[str, str] = {}
    for m in re.finditer(r'([A-Za-z]+)=("(?:[^"\\]|\\.)*"|[^;]*)', element):
        raw = m.group(2)
        fields[m.group(1).lower()] = raw[1:-1] if raw.startswith('"') else raw
    if "cert" in fields:
        return PeerCertificate.from_pem(urllib.parse.unquote(fields["cert"]))
    if re.fullmatch(r"[0-9a-fA-F]{64}", fields.get("hash", "")):
        return PeerCertificate(fields["hash"].lower(), None, None)
    return None


def forwarded_certificate(headers: dict[bytes, bytes], kind: str) -> PeerCertificate | None:
    """The client certificate a trusted proxy forwarded in its header of *kind* (``nginx``, ``envoy``)."""
    if kind == "nginx":
        raw = headers.get(NGINX_HEADER)
        if not raw or len(raw) > MAX_CERT_HEADER:
            return None
        return PeerCertificate.from_pem(urllib.parse.unquote(raw.decode("latin-1")))
    if kind == "envoy":
        raw = headers.get(ENVOY_HEADER)
        if not raw or len(raw) > MAX_CERT_HEADER:
            return None
        return _envoy_certificate(raw.decode("latin-1"))
    return None


class TrustMiddleware:
    """Sets the client address, scheme and client certificate of each HTTP request (module docstring)."""

    def __init__(self, app: Any, trust: TrustSettings, on_lifespan: Callable[[], None] | None = None) -> None:
        self.app = app
        self.trust = trust
        self.state = getattr(app, "state", None)
        self.on_lifespan = on_lifespan  # called on the serving event loop, once (reloads are applied there)

    def __getattr__(self, name: str) -> Any:  # the wrapped app's attributes (state, routes...)
        return getattr(self.app, name)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            if self.on_lifespan is not None:
                self.on_lifespan()
        elif scope["type"] == "http" and self.trust.trusted_proxies:
            client = scope.get("client")
            if client and _trusted(client[0], self.trust.trusted_proxies):
                headers = {
                    name: value
                    for name, value in scope["headers"]
                    if name in (b"forwarded", b"x-forwarded-for", b"x-forwarded-proto", NGINX_HEADER, ENVOY_HEADER)
                }
                address, proto = forwarded_client(headers, self.trust.trusted_proxies)
                if address is not None:
                    scope["client"] = (address, 0)
                if proto is not None:
                    scope["scheme"] = proto
                if self.trust.client_cert_header != "none":
                    scope[SCOPE_KEY] = forwarded_certificate(headers, self.trust.client_cert_header)
        if scope["type"] == "http" and scope.get("scheme") == "https":
            await self.app(scope, receive, _with_hsts(send))
            return
        await self.app(scope, receive, send)


#: ``Strict-Transport-Security`` on every answer over HTTPS: a browser that reached the console once over
#: HTTPS never tries it over plain HTTP again for a year (RFC 6797).
HSTS = (b"strict-transport-security", b"max-age=31536000")


def _with_hsts(send: Any) -> Any:
    async def sending(message: Any) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", ()), HSTS]
        await send(message)

    return sending
