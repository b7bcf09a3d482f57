"""``server.tls``, ``server.trusted_proxies`` and ``server.expiry_warning``: parsed with the marked-YAML
toolkit, so that a wrong value points at its line, and a certificate or key that cannot be loaded is
reported before anything listens."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

__all__ = ["TRUST_SERVER_KEYS", "TlsSettings", "TrustSettings", "parse_server_trust", "parse_tls"]

#: The keys this package adds to the ``server:`` section.
TRUST_SERVER_KEYS = {"tls", "trusted_proxies", "client_cert_header", "expiry_warning", "partners_reload"}
_TLS_KEYS = {"certificate", "key", "key_password", "client_ca", "min_version", "ciphers", "reload_interval"}
#: The TLS 1.2 suites offered (TLS 1.3's are OpenSSL's own, all AEAD): forward secrecy and AEAD only.
MODERN_CIPHERS = (
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
)
CLIENT_CERT_HEADERS = ("none", "nginx", "envoy")


@dataclass(frozen=True)
class TlsSettings:
    """``server.tls``: the files (absolute paths) and the protocol choices."""

    certificate: Path
    key: Path
    key_password: str | None = None
    client_ca: Path | None = None
    min_version: str = "1.2"
    ciphers: str = MODERN_CIPHERS
    reload_interval: float = 5.0
    where: Where = field(default=Where(None, None), compare=False)


@dataclass(frozen=True)
class TrustSettings:
    """What this package reads from ``server:``."""

    tls: TlsSettings | None = None
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    client_cert_header: str = "none"
    expiry_warning_days: int = 30
    partners_reload: float = 1.0


DEFAULT_TRUST = TrustSettings()


def _file(mapping: MarkedDict, key: str, base_dir: Path, what: str) -> Path:
    path = (base_dir / expect_str(mapping.get(key), mapping.at(key), what)).resolve()
    if not path.is_file():
        raise mapping.at(key).error(f"{what}: {path} does not exist or is not a file")
    return path


def parse_tls(tls: MarkedDict, base_dir: Path, what: str = "server.tls") -> TlsSettings:
    """A checked TLS section (``server.tls``, ``stomp.tls``): its files load together, now."""
    check_keys(tls, _TLS_KEYS, what)
    if "certificate" not in tls or "key" not in tls:
        raise tls.where.error(
            f"{what} needs certificate (the PEM chain, server certificate first) and key (its private key, PEM)"
        )
    certificate = _file(tls, "certificate", base_dir, f"{what}.certificate")
    key = _file(tls, "key", base_dir, f"{what}.key")
    password = None
    if tls.get("key_password") is not None:
        password = expect_str(tls["key_password"], tls.at("key_password"), f"{what}.key_password")
    client_ca = _file(tls, "client_ca", base_dir, f"{what}.client_ca") if tls.get("client_ca") else None
    min_version = "1.2"
    if "min_version" in tls:
        min_version = expect_choice(
            str(tls["min_version"]), tls.at("min_version"), f"{what}.min_version", ("1.2", "1.3")
        )
    ciphers = MODERN_CIPHERS
    if "ciphers" in tls:
        ciphers = expect_str(tls["ciphers"], tls.at("ciphers"), f"{what}.ciphers")
    interval = 5.0
    if "reload_interval" in tls:
        interval = parse_duration(tls["reload_interval"], tls.at("reload_interval"), f"{what}.reload_interval")
        if not 0 <= interval <= 3600:
            raise tls.at("reload_interval").error(
                f"{what}.reload_interval must be from 0 (no polling; SIGHUP only) to 3600 s"
            )
    settings = TlsSettings(certificate, key, password, client_ca, min_version, ciphers, interval, tls.where)
    from gateway.trust.tls import TlsConfigError, build_context  # a chain or key that does not load: now

    try:
        build_context(settings)
    except TlsConfigError as exc:
        raise tls.where.error(f"{what}: {exc}") from None
    return settings


def _networks(value: Any, where: Where) -> tuple[Any, ...]:
    items = expect_list(value, where, "server.trusted_proxies")
    out = []
    for i, item in enumerate(items):
        text = expect_str(item, items.at(i), "a server.trusted_proxies entry")
        try:
            out.append(ipaddress.ip_network(text.strip(), strict=False))
        except ValueError:
            raise items.at(i).error(
                f"server.trusted_proxies: {text!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)"
            ) from None
    return tuple(out)


def parse_server_trust(server: MarkedDict, base_dir: Path) -> TrustSettings:
    """The trust settings of the ``server:`` section *server* (ConfigError at the line of a wrong value)."""
    tls = None
    if server.get("tls") is not None:
        tls = parse_tls(expect_mapping(server["tls"], server.at("tls"), "server.tls"), base_dir)
    proxies: tuple[Any, ...] = ()
    if server.get("trusted_proxies") is not None:
        proxies = _networks(server["trusted_proxies"], server.at("trusted_proxies"))
    header = "none"
    if "client_cert_header" in server:
        header = expect_choice(
            server["client_cert_header"],
            server.at("client_cert_header"),
            "server.client_cert_header",
            CLIENT_CERT_HEADERS,
        )
        if header != "none" and not proxies:
            raise server.at("client_cert_header").error(
                "server.client_cert_header is read only from server.trusted_proxies; list the proxy's address there"
            )
    days = 30
    if "expiry_warning" in server:
        days = expect_int(
            server["expiry_warning"],
            server.at("expiry_warning"),
            "server.expiry_warning (days)",
            minimum=0,
            maximum=3650,
        )
    reload = 1.0
    if "partners_reload" in server:
        reload = parse_duration(server["partners_reload"], server.at("partners_reload"), "server.partners_reload")
        if not 0 <= reload <= 3600:
            raise server.at("partners_reload").error(
                "server.partners_reload must be from 0 (never: a restart applies changes) to 3600 s"
            )
    return TrustSettings(tls, proxies, header, days, reload)
