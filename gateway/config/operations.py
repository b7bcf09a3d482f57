"""The operations sections of the configuration: ``operators:``, ``admin:`` and ``logging:``.

::

    operators:                  # who may open the console and the admin API (never a partner key)
      alice: {role: operator, hash: "scrypt$ln=14,r=8,p=1$..."}   # `b2bgw operator new --name alice`
      bob:   {role: viewer,   hash: "scrypt$..."}
    admin:
      enabled: true             # default: true when operators are configured
      host: 127.0.0.1           # with port: a listener of its own (the partner API then has no admin paths)
      port: 8081                # default: none, the admin side is served by the partner API's server
      session_ttl: 8h           # a console session ends this long after its last use
      secure_cookies: auto      # auto: Secure when the request came over https; true; false
      login_attempts: 5         # failed logins per client address and per operator name ...
      login_window: 5m          # ... within this window, then 429 until it passes
      stats_interval: 5s        # how often the destinations' counters are read from the store
      metrics_on_partner_port: false  # true: /metrics on the partner API's port for anyone (docs/security.md)
    logging:
      format: text              # or json: one JSON object per line (gateway.telemetry.logs)

Each value is checked at its line when the configuration loads (a wrong one
is a :class:`~gateway.errors.ConfigError` with ``file:line``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from broker_core.hashes import is_secret_hash
from gateway.errors import clip
from gateway.marked import (
    MarkedDict,
    check_keys,
    expect_bool,
    expect_choice,
    expect_int,
    expect_mapping,
    expect_str,
    parse_duration,
)

__all__ = ["AdminSettings", "Operator", "apply_sections", "ROLES"]

#: ``viewer`` reads; ``operator`` also acts (replay, delete, move, purge); ``admin`` also manages partners,
#: their keys and pinned certificates.
ROLES = ("viewer", "operator", "admin")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
SECTIONS = {"operators", "admin", "logging"}


@dataclass(frozen=True)
class Operator:
    """One configured operator: ``name``, ``role`` (viewer, operator or admin) and the scrypt ``hash`` of its secret."""

    name: str
    role: str
    hash: str


@dataclass
class AdminSettings:
    enabled: bool | None = None  # None: on when operators are configured
    host: str | None = None
    port: int | None = None
    session_ttl: float = 8 * 3600.0
    secure_cookies: str = "auto"
    login_attempts: int = 5
    login_window: float = 300.0
    stats_interval: float = 5.0
    metrics_on_partner_port: bool = False
    operators: dict[str, Operator] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return bool(self.operators) if self.enabled is None else self.enabled

    @property
    def separate(self) -> bool:
        """Whether the admin side has a listener of its own."""
        return self.port is not None


def apply_sections(settings: Any, root: MarkedDict) -> None:
    """Read ``operators:``, ``admin:`` and ``logging:`` of *root* into *settings* (``admin``, ``log_format``)."""
    admin = AdminSettings()
    section = expect_mapping(root.get("admin"), root.at("admin"), "admin")
    check_keys(
        section,
        {
            "enabled",
            "host",
            "port",
            "session_ttl",
            "secure_cookies",
            "login_attempts",
            "login_window",
            "stats_interval",
            "metrics_on_partner_port",
        },
        "admin",
    )
    if "enabled" in section:
        admin.enabled = expect_bool(section["enabled"], section.at("enabled"), "admin.enabled")
    if "metrics_on_partner_port" in section:
        admin.metrics_on_partner_port = expect_bool(
            section["metrics_on_partner_port"], section.at("metrics_on_partner_port"), "admin.metrics_on_partner_port"
        )
    if "host" in section:
        admin.host = expect_str(section["host"], section.at("host"), "admin.host")
    if "port" in section:
        admin.port = expect_int(section["port"], section.at("port"), "admin.port", minimum=0, maximum=65535)
    if admin.host is not None and admin.port is None:
        raise section.at("host").error("admin.host needs admin.port: the admin side's own listener is host and port")
    if "session_ttl" in section:
        admin.session_ttl = parse_duration(section["session_ttl"], section.at("session_ttl"), "admin.session_ttl")
    if "secure_cookies" in section:
        value = section["secure_cookies"]
        value = {True: "true", False: "false"}.get(value, value) if isinstance(value, bool) else value
        admin.secure_cookies = expect_choice(
            value, section.at("secure_cookies"), "admin.secure_cookies", ("auto", "true", "false")
        )
    if "login_attempts" in section:
        admin.login_attempts = expect_int(
            section["login_attempts"], section.at("login_attempts"), "admin.login_attempts", minimum=1, maximum=1000
        )
    if "login_window" in section:
        admin.login_window = parse_duration(section["login_window"], section.at("login_window"), "admin.login_window")
    if "stats_interval" in section:
        admin.stats_interval = parse_duration(
            section["stats_interval"], section.at("stats_interval"), "admin.stats_interval"
        )
    for key in ("session_ttl", "login_window", "stats_interval"):
        if getattr(admin, key) <= 0:
            raise section.at(key).error(f"admin.{key} must be positive")

    operators = expect_mapping(root.get("operators"), root.at("operators"), "operators")
    for name, body in operators.items():
        where = operators.at(name)
        if not isinstance(name, str) or not _NAME.match(name):
            raise where.error(
                f"operator name {clip(str(name), 60)!r} must be 1-64 letters, digits, '.', '@', '-' or '_'"
            )
        entry = expect_mapping(body, where, f"operator {name!r}")
        check_keys(entry, {"role", "hash"}, f"operator {name!r}")
        role = expect_choice(entry.get("role"), entry.at("role"), f"operator {name!r} role", ROLES)
        encoded = expect_str(entry.get("hash"), entry.at("hash"), f"operator {name!r} hash")
        if not is_secret_hash(encoded):
            raise entry.at("hash").error(
                f"operator {name!r}: hash must be 'scrypt$ln=..,r=..,p=..$<salt>$<hash>' as printed by "
                "`b2bgw operator new`; secrets are never stored in the clear"
            )
        admin.operators[name] = Operator(name, role, encoded)
    settings.admin = admin

    logging_section = expect_mapping(root.get("logging"), root.at("logging"), "logging")
    check_keys(logging_section, {"format"}, "logging")
    if "format" in logging_section:
        settings.log_format = expect_choice(
            logging_section["format"], logging_section.at("format"), "logging.format", ("text", "json")
        )
