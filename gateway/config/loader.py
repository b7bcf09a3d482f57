"""The gateway's YAML configuration, with a file and line for every error.

One main file (``config/b2bgw.yaml``) holds the settings; its ``partners:`` and ``routes:`` sections are
either inline or the name of another YAML file (relative to the main file) whose top level is that section.
Every mapping and sequence is loaded as a :class:`MarkedDict` / :class:`MarkedList` that remembers where it
and each of its entries came from (:class:`Where`), so that any later check (a schema that does not load, an
XPath that does not compile, two routes that shadow each other) points at ``file:line``. Duplicate keys in a
mapping are an error (plain PyYAML silently keeps the last one).

The sections, all optional: ``store``, ``server``, ``limits``, ``namespaces``, ``schemas``, ``partners``,
``routes``, ``rules``, ``exchange``, ``workers``, ``etl``, ``stomp``, ``ledger``, ``delivery``, ``operators``, ``admin``
and ``logging`` (docs/configuration.md documents every key; tests/docs/test_configuration_reference.py
reads the keys from the ``check_keys`` calls and fails on one it does not find there). Parsing checks shapes and types, and the
``store.options``, ``stomp:`` and ``etl:`` values whole (by ``Broker.check_options`` and
``spark_etl.config.check_section``, the rules those parts apply themselves), so that a wrong one is reported
at its line before anything starts; :mod:`gateway.routing.partners` and :mod:`gateway.routing.routes` check the meaning of
the rest.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker_core import Broker, InvalidArgumentError
from gateway.config.stomp import STOMP_KEYS, stomp_section  # noqa: F401 (STOMP_KEYS re-exported)
from gateway.errors import ConfigError
from gateway.intake.xmlsafe import DEFAULT_LIMITS, LIMIT_FIELDS, IntakeLimits
from gateway.marked import (  # noqa: F401 (re-exported: the sections and callers use them)
    NOWHERE,
    MarkedDict,
    MarkedList,
    Where,
    _kind,
    check_keys,
    expect_bool,
    expect_choice,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
    load_yaml,
    parse_duration,
)
from gateway.trust.settings import DEFAULT_TRUST, TRUST_SERVER_KEYS, parse_server_trust
from spark_etl.config import EtlSettingError
from spark_etl.config import check_section as check_etl_section

#: ``limits:`` keys -> the IntakeLimits fields they set (every field; the body limit's key says what it counts).
LIMIT_KEYS = {"max_body_bytes" if name == "max_bytes" else name: name for name in LIMIT_FIELDS}

#: ``server.intake_facts``: when the gateway extracts the warehouse facts at intake (see gateway.exchange.stages).
INTAKE_FACTS = ("always", "when_idle", "never")

__all__ = [
    "CONFIG_SEARCH",
    "DEFAULT_CONFIG_NAME",
    "MarkedDict",
    "MarkedList",
    "RuleSetFile",
    "Settings",
    "Where",
    "default_config_path",
    "load_settings",
    "load_yaml",
    "parse_duration",
    "settings_from_mapping",
]

DEFAULT_CONFIG_NAME = "config/b2bgw.yaml"
#: The files ``b2bgw`` looks for in the current directory, in order, when neither ``-c`` nor ``$B2BGW_CONFIG`` names one.
CONFIG_SEARCH = (DEFAULT_CONFIG_NAME, "b2bgw.yaml")
DEFAULT_STORE_URL = "sqlite:///var/b2bgw.db"

_KNOWN_SECTIONS = {
    "store",
    "server",
    "limits",
    "namespaces",
    "schemas",
    "partners",
    "routes",
    "exchange",
    "workers",
    "etl",
    "stomp",
    "ledger",  # gateway.config.retention
    "rules",
    "operators",
    "admin",
    "logging",  # gateway.config.operations
    "as2",  # gateway.as2.config
    "delivery",  # gateway.delivery.config
}


# --------------------------------------------------------------------------- settings


@dataclass
class SchemaFile:
    """A partner's own XSD registered by configuration."""

    name: str
    path: Path
    version: str
    group: str | None
    where: Where


@dataclass
class RuleSetFile:
    """A Schematron rule set named by ``rules.sets`` (compiled by gateway.rules.rulesets)."""

    name: str
    path: Path
    phase: str | None
    where: Where


@dataclass
class Settings:
    """Everything the gateway reads from its configuration (shapes checked, meaning not yet)."""

    config_path: Path | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    store_url: str = DEFAULT_STORE_URL
    store_options: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 8080
    #: threads that parse, validate and extract documents (0: on the event loop)
    intake_threads: int = 0
    #: when the warehouse facts are extracted at intake: always, when_idle (not while saturated), never
    intake_facts: str = "when_idle"
    #: serving processes sharing the listening socket and the store (0: one per usable CPU)
    processes: int = 1
    #: with several processes, bind each to one CPU (round robin over the usable ones)
    pin_processes: bool = True
    #: worker processes taking in the bodies over 256 KiB, one at a time each (0: niced threads instead)
    intake_workers: int = 2
    #: processes working out the error reports of invalid documents at once (0: libxml2's errors only)
    explain_workers: int = 1
    #: how long an invalid document's full report may take before libxml2's errors are answered (s)
    explain_timeout: float = 1.0
    limits: IntakeLimits = DEFAULT_LIMITS
    namespaces: dict[str, str] = field(default_factory=dict)
    ubl_documents: list[str] = field(default_factory=list)
    schema_files: list[SchemaFile] = field(default_factory=list)
    schema_dirs: list[Path] = field(default_factory=list)
    partners: MarkedDict = field(default_factory=MarkedDict)
    #: the partners file's ``defaults:`` section (what every partner gets unless its entry says otherwise)
    partner_defaults: MarkedDict = field(default_factory=MarkedDict)
    routes: MarkedList = field(default_factory=MarkedList)
    workers: list[str] = field(default_factory=list)
    #: module -> concurrency override for its handlers (``- {module: m, concurrency: 4}``)
    worker_concurrency: dict[str, int] = field(default_factory=dict)
    workers_where: Where = NOWHERE
    late_reply_window: float = 3600.0
    reconcile_interval: float = 2.0
    etl: dict[str, Any] = field(default_factory=dict)
    stomp: dict[str, Any] | None = None
    #: ``ledger.retention`` (ledger_contract.retention.RetentionPolicy); None: documents stay online for ever
    retention: Any = None
    #: ``rules.sets``: the Schematron rule sets routes may apply
    rule_sets: list[RuleSetFile] = field(default_factory=list)
    #: ``rules.cache_dir`` (None: beside a SQLite store, else the user's cache folder)
    rules_cache_dir: Path | None = None
    #: ``rules.workers``: processes running the rules (SaxonC cannot be stopped in a thread)
    rules_workers: int = field(default_factory=lambda: min(2, os.cpu_count() or 1))
    #: ``rules.worker_memory_mb``: the memory of one rules worker process (it stops beyond)
    rules_worker_memory_mb: int = 1024
    #: ``limits.rules_seconds``: the processor time one document's business rules may take (gateway.rules.rulesets)
    rules_seconds: float = 2.0
    #: ``admin:`` and ``operators:`` (gateway.config.operations.AdminSettings), ``logging.format``
    admin: Any = None
    log_format: str = "text"
    #: ``server.tls``, ``server.trusted_proxies``... (gateway.trust.settings.TrustSettings)
    trust: Any = DEFAULT_TRUST
    #: ``as2:`` (gateway.as2.config.As2Settings): our AS2 id, key and certificate; None: no AS2
    as2: Any = None
    #: ``delivery.allow_addresses`` and ``deny_addresses`` (gateway.delivery.addresses.AddressPolicy): every
    #: endpoint's connections are held to them
    delivery_addresses: Any = None
    where: Where = NOWHERE
    #: the mapping these settings were built from: what rebuilds them in a worker process
    source: Any = field(default=None, repr=False, compare=False)

    @property
    def is_sql_store(self) -> bool:
        return self.store_url.startswith(("sqlite:", "postgresql"))


_PREFIX = re.compile(r"^[A-Za-z_][\w.\-]*$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def default_config_path() -> Path | None:
    """Where ``b2bgw`` looks for its configuration when none is given, or None.

    ``$B2BGW_CONFIG`` (used even if the file is missing, so a wrong value is
    reported, not skipped), else ``./config/b2bgw.yaml``, else ``./b2bgw.yaml``
    in the current directory. Never a file elsewhere: a command run outside a
    deployment must not pick up the sample configuration (and its published
    demo keys) of the source tree it was installed from.
    """
    env = os.environ.get("B2BGW_CONFIG")
    if env:
        return Path(env)
    for name in CONFIG_SEARCH:
        local = Path(name)
        if local.is_file():
            return local
    return None


def load_settings(path: str | Path | None = None) -> Settings:
    """Load the configuration file at *path* (default: :func:`default_config_path`).

    Raises :class:`ConfigError` when no file is given and none is found there.
    """
    config_path = Path(path) if path is not None else default_config_path()
    if config_path is None:
        raise ConfigError(
            f"no configuration file: none given with -c FILE, $B2BGW_CONFIG is not set, and neither "
            f"{' nor '.join('./' + name for name in CONFIG_SEARCH)} exists in {Path.cwd()}; pass -c FILE, set "
            f"$B2BGW_CONFIG, or run from the directory that holds config/b2bgw.yaml"
        )
    data = load_yaml(config_path, name=str(config_path))
    return settings_from_mapping(data, config_path=config_path)


def _section_file(value: Any, where: Where, base_dir: Path, section: str) -> Any:
    """An inline section, or the section loaded from the file it names."""
    if not isinstance(value, str):
        return value
    file = base_dir / value
    data = load_yaml(file, name=str(file))
    if isinstance(data, dict) and set(data) == {section}:  # the file may wrap the section in its name
        return data[section]
    return data


def settings_from_mapping(data: Any, *, config_path: Path | None = None, base_dir: Path | None = None) -> Settings:
    """Build :class:`Settings` from a loaded (marked) mapping."""
    file_where = Where(str(config_path) if config_path else None, 1)
    root = expect_mapping(data, file_where, "the configuration")
    check_keys(root, _KNOWN_SECTIONS, "the configuration")
    if base_dir is None:
        base_dir = config_path.resolve().parent if config_path is not None else Path.cwd()
    s = Settings(config_path=config_path, base_dir=base_dir, where=root.where, source=data)

    store = expect_mapping(root.get("store"), root.at("store"), "store")
    check_keys(store, {"url", "options"}, "store")
    if "url" in store:
        s.store_url = expect_str(store["url"], store.at("url"), "store.url")
    env_url = os.environ.get("B2BGW_STORE_URL")
    if env_url:
        s.store_url = env_url
    options = expect_mapping(store.get("options"), store.at("options"), "store.options")
    s.store_options = dict(options)
    try:  # every option's name and value, now rather than at start-up (and by `b2bgw routes check`)
        Broker.check_options(s.store_url, **s.store_options)
    except InvalidArgumentError as error:
        place = options.at(error.option) if error.option in options else store.at("url")
        raise place.error(f"store.options: {error}") from None

    server = expect_mapping(root.get("server"), root.at("server"), "server")
    check_keys(
        server,
        {
            "host",
            "port",
            "intake_threads",
            "intake_facts",
            "processes",
            "pin_processes",
            "intake_workers",
            "explain_workers",
            "explain_timeout",
        }
        | TRUST_SERVER_KEYS,
        "server",
    )
    s.trust = parse_server_trust(server, base_dir)  # tls, trusted_proxies, client_cert_header, expiry_warning
    if "host" in server:
        s.host = expect_str(server["host"], server.at("host"), "server.host")
    if "port" in server:
        s.port = expect_int(server["port"], server.at("port"), "server.port", minimum=0, maximum=65535)
    if "intake_threads" in server:
        s.intake_threads = expect_int(
            server["intake_threads"], server.at("intake_threads"), "server.intake_threads", minimum=0, maximum=64
        )
    if "intake_facts" in server:
        s.intake_facts = expect_choice(
            server["intake_facts"], server.at("intake_facts"), "server.intake_facts", INTAKE_FACTS
        )
    if "processes" in server:
        s.processes = expect_int(
            server["processes"], server.at("processes"), "server.processes", minimum=0, maximum=256
        )
    if "pin_processes" in server:
        s.pin_processes = expect_bool(server["pin_processes"], server.at("pin_processes"), "server.pin_processes")
    if "intake_workers" in server:
        s.intake_workers = expect_int(
            server["intake_workers"], server.at("intake_workers"), "server.intake_workers", minimum=0, maximum=16
        )
    if "explain_workers" in server:
        s.explain_workers = expect_int(
            server["explain_workers"], server.at("explain_workers"), "server.explain_workers", minimum=0, maximum=16
        )
    if "explain_timeout" in server:
        s.explain_timeout = parse_duration(
            server["explain_timeout"], server.at("explain_timeout"), "server.explain_timeout"
        )
        if not 0 < s.explain_timeout <= 10:
            raise server.at("explain_timeout").error("server.explain_timeout must be more than 0 and at most 10s")

    limits = expect_mapping(root.get("limits"), root.at("limits"), "limits")
    check_keys(limits, set(LIMIT_KEYS) | {"rules_seconds"}, "limits")
    if "rules_seconds" in limits:
        s.rules_seconds = parse_duration(limits["rules_seconds"], limits.at("rules_seconds"), "limits.rules_seconds")
        if not 0 < s.rules_seconds <= 600:
            raise limits.at("rules_seconds").error("limits.rules_seconds must be more than 0 and at most 600 s")
    values = {}
    for key, name in LIMIT_KEYS.items():
        value = limits.get(key, getattr(DEFAULT_LIMITS, name))
        values[name] = expect_int(value, limits.at(key), f"limits.{key}", minimum=1)
    try:
        s.limits = IntakeLimits(**values)
    except ValueError as exc:
        raise limits.where.error(str(exc)) from None

    namespaces = expect_mapping(root.get("namespaces"), root.at("namespaces"), "namespaces")
    for prefix, uri in namespaces.items():
        expect_str(prefix, namespaces.at(prefix), "a namespace prefix", pattern=_PREFIX, hint="use an XML name")
        s.namespaces[prefix] = expect_str(uri, namespaces.at(prefix), f"namespace {prefix!r}")

    _schemas(s, expect_mapping(root.get("schemas"), root.at("schemas"), "schemas"))

    partners = _section_file(root.get("partners"), root.at("partners"), base_dir, "partners")
    if isinstance(partners, dict) and "partners" in partners and set(partners) <= {"partners", "defaults"}:
        # a partners file with a defaults: section beside its partners: (the partners' request limits)
        s.partner_defaults = expect_mapping(partners.get("defaults"), partners.at("defaults"), "defaults")
        partners = partners["partners"]
    s.partners = expect_mapping(partners, getattr(partners, "where", root.at("partners")), "partners")
    routes = _section_file(root.get("routes"), root.at("routes"), base_dir, "routes")
    s.routes = expect_list(routes, getattr(routes, "where", root.at("routes")), "routes")

    exchange = expect_mapping(root.get("exchange"), root.at("exchange"), "exchange")
    check_keys(exchange, {"late_reply_window", "reconcile_interval"}, "exchange")
    if "late_reply_window" in exchange:
        s.late_reply_window = parse_duration(
            exchange["late_reply_window"], exchange.at("late_reply_window"), "exchange.late_reply_window"
        )
    if "reconcile_interval" in exchange:
        s.reconcile_interval = parse_duration(
            exchange["reconcile_interval"], exchange.at("reconcile_interval"), "exchange.reconcile_interval"
        )
        if s.reconcile_interval <= 0:
            raise exchange.at("reconcile_interval").error("exchange.reconcile_interval must be positive")

    workers = expect_list(root.get("workers"), root.at("workers"), "workers")
    s.workers_where = root.at("workers")
    for i, item in enumerate(workers):
        if isinstance(item, dict):
            entry = expect_mapping(item, workers.at(i), "a worker")
            check_keys(entry, {"module", "concurrency"}, "a worker")
            module = expect_str(
                entry.get("module"),
                entry.at("module"),
                "a worker module",
                pattern=_MODULE,
                hint="a dotted Python module name",
            )
            if "concurrency" in entry:
                s.worker_concurrency[module] = expect_int(
                    entry["concurrency"], entry.at("concurrency"), f"worker {module} concurrency", minimum=1, maximum=64
                )
        else:
            module = expect_str(
                item, workers.at(i), "a worker module", pattern=_MODULE, hint="a dotted Python module name"
            )
        s.workers.append(module)

    if root.get("rules") is not None:
        _rules(s, expect_mapping(root.get("rules"), root.at("rules"), "rules"))

    etl = expect_mapping(root.get("etl"), root.at("etl"), "etl")
    try:  # the warehouse load's own rules (spark_etl.config), now rather than when it is scheduled
        check_etl_section(etl)
    except EtlSettingError as error:
        raise etl.at(error.key).error(f"etl.{error.key}: {error}") from None
    s.etl = dict(etl)
    if root.get("stomp") is not None:
        s.stomp = stomp_section(expect_mapping(root.get("stomp"), root.at("stomp"), "stomp"), s.base_dir)
    if root.get("ledger") is not None:
        _ledger(s, expect_mapping(root.get("ledger"), root.at("ledger"), "ledger"))
    if root.get("as2") is not None:
        from gateway.as2.config import parse_as2_section

        s.as2 = parse_as2_section(expect_mapping(root.get("as2"), root.at("as2"), "as2"))
    if root.get("delivery") is not None:
        from gateway.delivery.config import parse_delivery_section

        s.delivery_addresses = parse_delivery_section(
            expect_mapping(root.get("delivery"), root.at("delivery"), "delivery")
        )
    from gateway.config.operations import apply_sections  # operators:, admin:, logging:

    apply_sections(s, root)
    return s


def _ledger(s: Settings, ledger: MarkedDict) -> None:
    """The ``ledger:`` section: its ``retention`` policy (gateway.config.retention)."""
    from gateway.config.retention import parse_retention

    check_keys(ledger, {"retention"}, "ledger")
    if ledger.get("retention") is not None:
        route_ids = {
            item["id"]: item for item in s.routes if isinstance(item, dict) and isinstance(item.get("id"), str)
        }
        s.retention = parse_retention(
            ledger["retention"], ledger.at("retention"), late_reply_window=s.late_reply_window, route_ids=route_ids
        )


_RULE_SET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _rules(s: Settings, rules: MarkedDict) -> None:
    """The ``rules:`` section: Schematron rule sets (``sets``), their cache folder and worker processes."""
    check_keys(rules, {"sets", "cache_dir", "workers", "worker_memory_mb"}, "rules")
    sets = expect_mapping(rules.get("sets"), rules.at("sets"), "rules.sets")
    for name, body in sets.items():
        where = sets.at(name)
        set_name = expect_str(
            name, where, "a rule set name", pattern=_RULE_SET_NAME, hint="1-100 letters, digits, '.', '-' or '_'"
        )
        if isinstance(body, str):
            entry = MarkedDict(file=body)
            entry.where, entry.key_where = where, {}
        else:
            entry = expect_mapping(body, where, f"rule set {set_name!r}")
        check_keys(entry, {"file", "phase"}, f"rule set {set_name!r}")
        file = expect_str(
            entry.get("file"), entry.at("file") if "file" in entry else entry.where, f"rule set {set_name!r} file"
        )
        phase = None
        if entry.get("phase") is not None:
            phase = expect_str(entry["phase"], entry.at("phase"), f"rule set {set_name!r} phase")
        s.rule_sets.append(
            RuleSetFile(set_name, (s.base_dir / file).resolve(), phase, entry.at("file") if "file" in entry else where)
        )
    if rules.get("cache_dir") is not None:
        s.rules_cache_dir = (
            s.base_dir / expect_str(rules["cache_dir"], rules.at("cache_dir"), "rules.cache_dir")
        ).resolve()
    if "workers" in rules:
        s.rules_workers = expect_int(rules["workers"], rules.at("workers"), "rules.workers", minimum=1, maximum=64)
    if "worker_memory_mb" in rules:
        s.rules_worker_memory_mb = expect_int(
            rules["worker_memory_mb"], rules.at("worker_memory_mb"), "rules.worker_memory_mb", minimum=128
        )


def _schemas(s: Settings, schemas: MarkedDict) -> None:
    check_keys(schemas, {"ubl-2.1", "files", "dirs"}, "schemas")
    ubl = expect_list(schemas.get("ubl-2.1"), schemas.at("ubl-2.1"), "schemas.ubl-2.1")
    for i, doc in enumerate(ubl):
        s.ubl_documents.append(expect_str(doc, ubl.at(i), "a UBL 2.1 document name"))
    dirs = expect_list(schemas.get("dirs"), schemas.at("dirs"), "schemas.dirs")
    for i, d in enumerate(dirs):
        path = (s.base_dir / expect_str(d, dirs.at(i), "a schema directory")).resolve()
        if not path.is_dir():
            raise dirs.at(i).error(f"schema directory {path} does not exist")
        s.schema_dirs.append(path)
    files = expect_list(schemas.get("files"), schemas.at("files"), "schemas.files")
    for i, item in enumerate(files):
        entry = expect_mapping(item, files.at(i), "a schema file entry")
        check_keys(entry, {"name", "path", "version", "group"}, "a schema file entry")
        name = expect_str(entry.get("name"), entry.at("name"), "schema name")
        path = (s.base_dir / expect_str(entry.get("path"), entry.at("path"), "schema path")).resolve()
        version = str(entry.get("version", "1.0"))
        if version not in ("1.0", "1.1"):
            raise entry.at("version").error(f"schema version must be '1.0' or '1.1', not {version!r}")
        group = entry.get("group")
        if group is not None:
            group = expect_str(group, entry.at("group"), "schema group")
        s.schema_files.append(SchemaFile(name, path, version, group, entry.where))
