"""Each partner's trust entries in ``partners.yaml``: its authentication policy (``auth``), its pinned
client certificates (``certificates``) and its API keys' windows (``label``, ``not_before``,
``not_after`` beside a key's ``id`` and ``hash``).

A pin is a SHA-256 fingerprint of the certificate (hex, colons allowed), or a ``subject`` and ``issuer``
(RFC 4514, ``CN=orders.acme.example,O=Acme``) that a certificate chaining to ``server.tls.client_ca`` (or
verified by a trusted proxy) must carry exactly. A certificate is pinned to one partner only.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509

from gateway.marked import MarkedDict, Where, check_keys, expect_choice, expect_list, expect_mapping, expect_str
from gateway.trust.peer import PeerCertificate

__all__ = [
    "trust_registry",
    "AUTH_POLICIES",
    "KEY_WINDOW_KEYS",
    "PARTNER_TRUST_KEYS",
    "CertificatePin",
    "KeyWindow",
    "PartnerTrust",
    "TrustRegistry",
    "parse_partner_trust",
]

#: ``auth``: what a partner must present. ``key``: an API key (a pinned certificate, if presented, must be
#: its own); ``certificate``: a pinned client certificate alone; ``both``: a key and its own certificate.
AUTH_POLICIES = ("key", "certificate", "both")
#: The keys this package adds to a partner's entry, and to one of its ``keys:``.
PARTNER_TRUST_KEYS = {"auth", "certificates"}
KEY_WINDOW_KEYS = {"label", "not_before", "not_after"}
_PIN_KEYS = {"sha256", "subject", "issuer", "label", "not_before", "not_after"}
_HEX = re.compile(r"^[0-9a-f]{64}$")


def _when(value: Any, where: Where, what: str) -> dt.datetime:
    """A YAML date or timestamp, or an ISO 8601 string, as an aware UTC datetime (a date: 00:00 UTC)."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, dt.date):
        return dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC)
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    raise where.error(f"{what} must be a date or a timestamp (2027-01-31, 2027-01-31T12:00:00Z); got {value!r}")


@dataclass(frozen=True, slots=True)
class Window:
    """When something is valid: from ``not_before`` (None: always was) to ``not_after`` (None: never ends)."""

    label: str | None = None
    not_before: dt.datetime | None = None
    not_after: dt.datetime | None = None

    def valid_at(self, now: dt.datetime) -> bool:
        return (self.not_before is None or now >= self.not_before) and (self.not_after is None or now < self.not_after)


KeyWindow = Window


def _window(entry: MarkedDict, what: str) -> Window:
    label = expect_str(entry["label"], entry.at("label"), f"{what} label") if entry.get("label") is not None else None
    before = (
        _when(entry["not_before"], entry.at("not_before"), f"{what} not_before")
        if entry.get("not_before") is not None
        else None
    )
    after = (
        _when(entry["not_after"], entry.at("not_after"), f"{what} not_after")
        if entry.get("not_after") is not None
        else None
    )
    if before is not None and after is not None and after <= before:
        raise entry.at("not_after").error(f"{what}: not_after must come after not_before")
    return Window(label, before, after)


@dataclass(frozen=True, slots=True)
class CertificatePin:
    """One pinned client certificate: by fingerprint, or by subject and issuer; with its window."""

    sha256: str | None
    subject: x509.Name | None
    issuer: x509.Name | None
    window: Window = field(default_factory=Window)

    def matches(self, cert: PeerCertificate) -> bool:
        if self.sha256 is not None:
            return cert.sha256 == self.sha256
        return cert.subject is not None and cert.subject == self.subject and cert.issuer == self.issuer

    def describe(self) -> str:
        if self.sha256 is not None:
            return f"sha256:{self.sha256}"
        return f"subject {self.subject.rfc4514_string()} issuer {self.issuer.rfc4514_string()}"  # type: ignore[union-attr]


@dataclass(frozen=True)
class PartnerTrust:
    """A partner's policy, pins and key windows."""

    auth: str = "key"
    pins: tuple[CertificatePin, ...] = ()
    key_windows: dict[str, Window] = field(default_factory=dict)


def _name(entry: MarkedDict, key: str, what: str) -> x509.Name:
    text = expect_str(entry.get(key), entry.at(key), what)
    try:
        return x509.Name.from_rfc4514_string(text)
    except ValueError as exc:
        raise entry.at(key).error(f"{what} {text!r} is not an RFC 4514 name ({exc})") from None


def _pin(item: Any, where: Where, what: str) -> CertificatePin:
    entry = expect_mapping(item, where, what)
    check_keys(entry, _PIN_KEYS, what)
    window = _window(entry, what)
    if "sha256" in entry:
        if "subject" in entry or "issuer" in entry:
            raise where.error(f"{what}: pin by sha256, or by subject and issuer, not both")
        text = expect_str(entry["sha256"], entry.at("sha256"), f"{what} sha256").replace(":", "").strip().lower()
        if not _HEX.match(text):
            raise entry.at("sha256").error(
                f"{what} sha256 must be the certificate's SHA-256 fingerprint, 64 hex "
                "digits (colons allowed), as `openssl x509 -noout -fingerprint -sha256` "
                "prints it"
            )
        return CertificatePin(text, None, None, window)
    if "subject" not in entry or "issuer" not in entry:
        raise where.error(f"{what} needs sha256, or subject and issuer")
    return CertificatePin(
        None, _name(entry, "subject", f"{what} subject"), _name(entry, "issuer", f"{what} issuer"), window
    )


def parse_partner_trust(entry: MarkedDict, partner_id: str) -> PartnerTrust:
    """The trust entries of partner *partner_id*'s mapping *entry* (``auth``, ``certificates``, its keys'
    windows); ConfigError at the line of a wrong one."""
    what = f"partner {partner_id!r}"
    auth = expect_choice(entry.get("auth", "key"), entry.at("auth"), f"{what} auth", AUTH_POLICIES)
    certs = expect_list(entry.get("certificates"), entry.at("certificates"), f"{what} certificates")
    pins = tuple(_pin(item, certs.at(i), f"{what} certificate") for i, item in enumerate(certs))
    if auth in ("certificate", "both") and not pins:
        raise entry.at("auth").error(f"{what} auth: {auth} needs at least one entry under certificates:")
    windows: dict[str, Window] = {}
    keys = expect_list(entry.get("keys"), entry.at("keys"), f"{what} keys")
    for i, item in enumerate(keys):
        key = expect_mapping(item, keys.at(i), "an API key entry")
        if isinstance(key.get("id"), str):
            windows[key["id"]] = _window(key, f"API key {key['id']!r}")
    return PartnerTrust(auth, pins, windows)


class TrustRegistry:
    """Every partner's trust entries; finds the partner a certificate is pinned to."""

    def __init__(self, partners: dict[str, PartnerTrust]) -> None:
        self.partners = dict(partners)
        self.by_fingerprint: dict[str, tuple[str, CertificatePin]] = {}
        self.by_name: list[tuple[str, CertificatePin]] = []
        for partner_id, trust in self.partners.items():
            for pin in trust.pins:
                if pin.sha256 is not None:
                    other = self.by_fingerprint.get(pin.sha256)
                    if other is not None and other[0] != partner_id:
                        raise ValueError(
                            f"certificate sha256:{pin.sha256} is pinned to partners {other[0]!r} and "
                            f"{partner_id!r}; a certificate identifies one partner"
                        )
                    self.by_fingerprint[pin.sha256] = (partner_id, pin)
                else:
                    self.by_name.append((partner_id, pin))

    def get(self, partner_id: str) -> PartnerTrust:
        return self.partners.get(partner_id) or _DEFAULT

    def pinned(self, cert: PeerCertificate) -> tuple[str, CertificatePin] | None:
        """The partner *cert* is pinned to, and the pin; None if no partner pinned it."""
        found = self.by_fingerprint.get(cert.sha256)
        if found is not None:
            return found
        for partner_id, pin in self.by_name:
            if pin.matches(cert):
                return partner_id, pin
        return None

    def key_window(self, partner_id: str, key_id: str) -> Window | None:
        return self.get(partner_id).key_windows.get(key_id)


_DEFAULT = PartnerTrust()
EMPTY_TRUST = TrustRegistry({})


def trust_registry(partners: dict[str, PartnerTrust], where: Where) -> TrustRegistry:
    """:class:`TrustRegistry` of *partners*; a certificate pinned to two partners is a ConfigError."""
    try:
        return TrustRegistry(partners)
    except ValueError as exc:
        raise where.error(f"partners: {exc}") from None
