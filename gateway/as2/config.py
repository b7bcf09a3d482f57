"""AS2's configuration: our identity (the ``as2:`` section of b2bgw.yaml) and each partner's agreement
(the ``as2:`` key of its entry in partners.yaml). docs/as2.md lists every key.

Certificate and key files are read when the configuration is checked, so that a missing or wrong file is a
configuration error at its line, not a failure on the first message. Relative paths are relative to the file
that names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.as2.cms import Identity
from gateway.as2.errors import As2Error
from gateway.delivery.addresses import AddressPolicy, parse_networks
from gateway.errors import clip
from gateway.marked import (
    MarkedDict,
    Where,
    check_keys,
    expect_bool,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
)

__all__ = ["AS2_ID", "As2Settings", "PartnerAgreement", "parse_as2_section", "parse_partner_as2", "read_certificates"]

#: RFC 4130 6.2: an AS2 id is 1 to 128 printable ASCII characters (quoted when it has spaces; we take none)
AS2_ID = re.compile(r"^[!-~]{1,128}$")
_OUR_KEYS = {"id", "key", "certificate", "max_message_bytes", "mdn_timeout"}
_PARTNER_KEYS = {
    "id",
    "certificate",
    "encryption_certificate",
    "require_signature",
    "require_encryption",
    "allow_3des",
    "allow_sha1",
    "async_mdn_urls",
    "async_mdn_allow_addresses",
}


@dataclass(frozen=True, slots=True)
class As2Settings:
    """Our side: AS2 id, private key and certificate, and bounds."""

    id: str
    identity: Identity
    #: the largest AS2 request body read (encrypted and base64 add about 40% to the document)
    max_message_bytes: int | None = None
    #: how long sending an asynchronous MDN may take (s)
    mdn_timeout: float = 30.0
    where: Where = field(default=Where(None, None), compare=False)


@dataclass(frozen=True, slots=True)
class PartnerAgreement:
    """What one partner's AS2 messages must be and how they are checked."""

    partner: str
    id: str
    certificates: tuple[x509.Certificate, ...]
    encryption_certificate: x509.Certificate
    require_signature: bool = True
    require_encryption: bool = True
    allow_3des: bool = False
    allow_sha1: bool = False
    #: the URLs (prefixes) the partner's Receipt-Delivery-Option may name; none: no asynchronous MDN is sent
    async_mdn_urls: tuple[str, ...] = ()
    #: where asynchronous MDNs may connect: public addresses, and private ones only when listed here
    async_mdn_addresses: AddressPolicy = field(default_factory=AddressPolicy)

    def async_mdn_refusal(self, url: str) -> str | None:
        """Why an asynchronous MDN may not go to *url* (a ``Receipt-Delivery-Option``), or None when it may."""
        target = _url_key(url)
        if target is None:
            return f"Receipt-Delivery-Option {clip(url, 200)!r} is not an http(s) URL with a host and no credentials"
        for allowed in self.async_mdn_urls:
            key = _url_key(allowed)
            if key is not None and key[:3] == target[:3] and _under(target[3], key[3]):
                return None
        return f"Receipt-Delivery-Option {clip(url, 200)!r} is not among the partner's as2.async_mdn_urls" + (
            "" if self.async_mdn_urls else " (none are configured)"
        )


def _under(path: str, prefix: str) -> bool:
    """Whether *path* is *prefix* or below it (``/mdn`` covers ``/mdn/1`` and ``/mdn?id=1``, not ``/mdnx``)."""
    if path == prefix or prefix.endswith("/") and path.startswith(prefix):
        return True
    return path.startswith(prefix) and path[len(prefix)] in "/?"


def _url_key(url: str) -> tuple[str, str, int, str] | None:
    """scheme, host, port and path of an http(s) URL without credentials, or None."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        return None
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80), path


def _path(value: Any, where: Where, what: str) -> Path:
    text = expect_str(value, where, what)
    path = Path(text)
    if not path.is_absolute() and where.file:
        path = Path(where.file).resolve().parent / path
    if not path.is_file():
        raise where.error(f"{what}: no file {path}; make one with `b2bgw as2 keys new` or ask the partner for it")
    return path


def read_certificates(path: Path, where: Where, what: str) -> list[x509.Certificate]:
    """The PEM (or DER) certificates in *path*."""
    data = path.read_bytes()
    try:
        if b"-----BEGIN" in data:
            return x509.load_pem_x509_certificates(data)
        return [x509.load_der_x509_certificate(data)]
    except ValueError:
        raise where.error(f"{what}: {path} holds no PEM or DER X.509 certificate") from None


def parse_as2_section(section: MarkedDict) -> As2Settings:
    """The ``as2:`` section: ``id``, ``key``, ``certificate`` (both PEM files), bounds."""
    check_keys(section, _OUR_KEYS, "as2")
    as2_id = expect_str(
        section.get("id"),
        section.at("id"),
        "as2.id",
        pattern=AS2_ID,
        hint="1-128 printable ASCII characters without spaces",
    )
    key_path = _path(section.get("key"), section.at("key"), "as2.key")
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise section.at("key").error(f"as2.key: {key_path} is not an unencrypted PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise section.at("key").error("as2.key must be an RSA key (AS2 partners expect RSA)")
    cert_path = _path(section.get("certificate"), section.at("certificate"), "as2.certificate")
    certificate = read_certificates(cert_path, section.at("certificate"), "as2.certificate")[0]
    if certificate.public_key().public_numbers() != key.public_key().public_numbers():
        raise section.at("certificate").error("as2.certificate is not the certificate of as2.key")
    max_bytes = None
    if "max_message_bytes" in section:
        max_bytes = expect_int(
            section["max_message_bytes"],
            section.at("max_message_bytes"),
            "as2.max_message_bytes",
            minimum=1024,
            maximum=1 << 31,
        )
    timeout = 30.0
    if "mdn_timeout" in section:
        timeout = float(
            expect_int(section["mdn_timeout"], section.at("mdn_timeout"), "as2.mdn_timeout", minimum=1, maximum=600)
        )
    settings = As2Settings(as2_id, Identity(key, certificate), max_bytes, timeout, section.where)
    set_our_settings(settings)  # what the delivery engine's as2 transports send as
    return settings


def parse_partner_as2(partner_id: str, value: Any, where: Where) -> PartnerAgreement:
    """A partner's ``as2:`` mapping (called by gateway.routing.partners for each partner that has one)."""
    what = f"partner {partner_id!r} as2"
    entry = expect_mapping(value, where, what)
    check_keys(entry, _PARTNER_KEYS, what)
    as2_id = expect_str(
        entry.get("id"),
        entry.at("id"),
        f"{what}.id",
        pattern=AS2_ID,
        hint="1-128 printable ASCII characters without spaces",
    )
    certs = read_certificates(
        _path(entry.get("certificate"), entry.at("certificate"), f"{what}.certificate"),
        entry.at("certificate"),
        f"{what}.certificate",
    )
    encryption = certs[0]
    if "encryption_certificate" in entry:
        encryption = read_certificates(
            _path(
                entry["encryption_certificate"], entry.at("encryption_certificate"), f"{what}.encryption_certificate"
            ),
            entry.at("encryption_certificate"),
            f"{what}.encryption_certificate",
        )[0]
    flags = {
        name: expect_bool(entry.get(name, default), entry.at(name), f"{what}.{name}")
        for name, default in (
            ("require_signature", True),
            ("require_encryption", True),
            ("allow_3des", False),
            ("allow_sha1", False),
        )
    }
    urls = expect_list(entry.get("async_mdn_urls"), entry.at("async_mdn_urls"), f"{what}.async_mdn_urls")
    for i, url in enumerate(urls):
        if not isinstance(url, str) or _url_key(url) is None:
            raise urls.at(i).error(
                f"{what}.async_mdn_urls: {clip(repr(url), 120)} is not an http:// or https:// URL with a host "
                "and no credentials"
            )
    allow = parse_networks(
        expect_list(
            entry.get("async_mdn_allow_addresses"),
            entry.at("async_mdn_allow_addresses"),
            f"{what}.async_mdn_allow_addresses",
        ),
        entry.at("async_mdn_allow_addresses"),
        f"{what}.async_mdn_allow_addresses",
    )
    return PartnerAgreement(
        partner_id,
        as2_id,
        tuple(certs),
        encryption,
        **flags,
        async_mdn_urls=tuple(str(u).strip() for u in urls),
        async_mdn_addresses=AddressPolicy(allow),
    )


_OURS: list[As2Settings] = []


def set_our_settings(settings: As2Settings) -> None:
    """Our AS2 id, key and certificate, for the transports (set when the ``as2:`` section is loaded)."""
    _OURS[:] = [settings]


def our_mdn_timeout() -> float:
    """``as2.mdn_timeout``: how long one attempt at an asynchronous MDN may take (30 s without an ``as2:``)."""
    return _OURS[0].mdn_timeout if _OURS else 30.0


def _ours() -> As2Settings:
    if not _OURS:
        raise As2Error("No `as2:` section is configured: our AS2 id, key and certificate are needed to send AS2.")
    return _OURS[0]
