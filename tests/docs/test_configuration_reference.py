"""docs/configuration.md documents every configuration key the code accepts, with its default and unit.

The keys are read from the code, not from a list kept here: every ``check_keys(mapping, ALLOWED, what)`` call
under ``gateway/`` (the allowed set evaluated in its module), the broker's option tables and the warehouse
load's ``DEFAULTS``. A key added to the code without a row in the reference fails with the key's path, the
place in the code that accepts it and the page to add it to; a row naming a key the code does not accept fails
too, and the defaults the code declares as values are compared with the table's.

A feature with a page of its own may document its keys there: a row of docs/configuration.md for the section
(`| \\`outbound\\` | ... | [Outbound delivery](outbound.md) |`) that links to the page lets the keys under it be
documented in that page's tables, by full path or by last name.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "configuration.md"
PAGE = "docs/configuration.md"

#: What a ``check_keys`` call's ``what`` argument (its source text) names -> the configuration paths it checks.
#: A dotted lower-case name (``"ledger.retention"``, a new section's ``"outbound"``) needs no entry here.
WHAT_PATHS = {
    "'the configuration'": [""],
    "'a worker'": ["workers[]"],
    "f'rule set {set_name!r}'": ["rules.sets.NAME"],
    "'a schema file entry'": ["schemas.files[]"],
    "f'operator {name!r}'": ["operators.NAME"],
    "gateway/config/retention.py:what": ["ledger.retention.routes.ROUTE", "ledger.retention.document_types.TYPE"],
    "gateway/config/stomp.py:what": ["stomp.users.LOGIN"],
    "gateway/trust/pins.py:what": ["partners.ID.certificates[]"],
    "gateway/trust/settings.py:what": ["server.tls", "stomp.tls"],
    "gateway/as2/config.py:what": ["partners.ID.as2"],
    "f'{what} notify'": ["partners.ID.notify"],
    "f'{what} backoff'": ["partners.ID.endpoints.NAME.backoff"],
    "f'{what} breaker'": ["partners.ID.endpoints.NAME.breaker"],
    "f'{what} deliver'": ["routes[].deliver"],
    "gateway/delivery/https.py:what": ["partners.ID.endpoints.NAME"],
    "gateway/as2/mdn_delivery.py:what": ["partners.ID.endpoints.NAME"],
    "f'{what} limits'": ["partners.ID.limits", "defaults.limits"],
    "'defaults'": ["defaults"],
    "f'partner {partner_id!r}'": ["partners.ID"],
    "'an API key entry'": ["partners.ID.keys[]"],
    "'a route'": ["routes[]"],
    "f'{what} property {pname!r}'": ["routes[].properties.NAME"],
}
_SECTION_NAME = re.compile(r"^'([a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*)'$")


@dataclass(frozen=True)
class Key:
    path: str
    source: str  # file:line of the code that accepts it


def _check_keys_calls() -> list[Key]:
    keys: list[Key] = []
    for file in sorted((ROOT / "gateway").rglob("*.py")):
        tree = ast.parse(file.read_text(encoding="utf-8"))
        calls = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "check_keys"
            and len(node.args) == 3
        ]
        if not calls:
            continue
        module = importlib.import_module(".".join(file.relative_to(ROOT).with_suffix("").parts))
        for call in calls:
            where = f"{file.relative_to(ROOT)}:{call.lineno}"
            what = ast.unparse(call.args[2])
            try:
                allowed = eval(compile(ast.Expression(call.args[1]), where, "eval"), vars(module))
            except NameError as exc:  # a local variable: name the keys in a module-level set instead
                pytest.fail(f"{where}: check_keys's allowed keys must be a literal or a module-level name ({exc})")
            match = _SECTION_NAME.match(what)
            in_file = f"{file.relative_to(ROOT)}:{what}"  # a local name means something else in each file
            if in_file in WHAT_PATHS:
                prefixes = WHAT_PATHS[in_file]
            elif what in WHAT_PATHS:
                prefixes = WHAT_PATHS[what]
            elif match:
                prefixes = [match.group(1)]
            else:
                pytest.fail(
                    f"{where}: check_keys checks the keys of {what}: name the configuration path it checks "
                    f"in WHAT_PATHS of {Path(__file__).relative_to(ROOT)}, and document its keys "
                    f"({', '.join(sorted(allowed))}) in {PAGE}"
                )
            for prefix in prefixes:
                keys += [Key(f"{prefix}.{name}" if prefix else name, where) for name in allowed]
    return keys


def code_keys() -> list[Key]:
    """Every configuration key the code accepts."""
    from broker_core._options import BROKER_OPTIONS, SQL_STORE_OPTIONS
    from spark_etl.config import DEFAULTS

    keys = _check_keys_calls()
    options = {**BROKER_OPTIONS, **SQL_STORE_OPTIONS}
    keys += [Key(f"store.options.{name}", "broker_core/_options.py") for name in options]
    keys += [Key(f"etl.{name}", "spark_etl/config.py DEFAULTS") for name in DEFAULTS]
    return sorted(set(keys), key=lambda key: key.path)


_ROW = re.compile(r"^\|\s*`([^`]+)`[^|]*\|(.*)\|\s*$")


def table_rows(page: Path) -> dict[str, list[str]]:
    """First-column key -> the row's other cells, for every table row of *page* whose first cell is `code`."""
    rows: dict[str, list[str]] = {}
    for line in page.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line.strip())
        if match:
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", match.group(2))]
            rows[match.group(1)] = cells
            # a first cell naming several keys (`backoff.initial`, `backoff.max`) documents each of them
            first = line.strip().split("|")[1]
            for name in re.findall(r"`([^`]+)`", first)[1:]:
                rows.setdefault(name, cells)
    return rows


REFERENCE_ROWS = table_rows(REFERENCE)
KEYS = code_keys()
_LINK = re.compile(r"\]\(([a-z0-9-]+\.md)(?:#[^)]*)?\)")


def _delegated(path: str) -> list[Path]:
    """The pages a reference row of *path*'s section (or any ancestor) hands its keys to."""
    pages = []
    parts = path.split(".")
    for n in range(1, len(parts)):
        cells = REFERENCE_ROWS.get(".".join(parts[:n]))
        if cells:
            pages += [DOCS / name for name in _LINK.findall(cells[-1])]
    return pages


def test_the_code_has_keys_to_check():
    paths = {key.path for key in KEYS}
    assert len(paths) > 150, paths  # the sections, the broker's options, the warehouse load's, routes, partners
    assert {
        "limits.max_text_length",
        "store.options.lease_timeout",
        "etl.lock_ttl",
        "routes[].idempotency_key",
        "routes[].rules",
        "rules.workers",
        "admin.session_ttl",
        "logging.format",
        "operators.NAME.hash",
        "ledger.retention.batch",
        "partners.ID.limits.burst",
        "stomp.users",
    } <= paths


@pytest.mark.parametrize("key", KEYS, ids=lambda key: key.path)
def test_every_key_is_documented_with_its_default_and_unit(key):
    cells = REFERENCE_ROWS.get(key.path)
    if cells is None:
        leaf = key.path.rsplit(".", 1)[-1]
        for page in _delegated(key.path):
            rows = table_rows(page) if page.exists() else {}
            if key.path in rows or leaf in rows or any(key.path.endswith("." + name) for name in rows):
                return
        pytest.fail(
            f"configuration key {key.path!r} (accepted at {key.source}) is not documented: add a row "
            f"| `{key.path}` | default | unit | meaning | to {PAGE}, in its section's table (or to the "
            f"feature's page that {PAGE}'s row for its section links to)"
        )
    assert len(cells) >= 3 and all(cells[:3]), (
        f"{PAGE}: the row of {key.path!r} needs a default, a unit (— for none) and a meaning: {cells}"
    )


def test_the_reference_names_no_key_the_code_does_not_accept():
    known = {key.path for key in KEYS}
    sections = {path.split(".")[0] for path in known if "." in path}
    documented = {path for path in REFERENCE_ROWS if path.split(".")[0].split("[")[0] in sections | known}
    stale = sorted(documented - known)
    assert not stale, f"{PAGE} documents keys the code does not accept (remove or rename them): {stale}"


def _default(path: str) -> str:
    return REFERENCE_ROWS[path][0].strip("`")


def test_the_documented_defaults_are_the_codes():
    from gateway.config.loader import LIMIT_KEYS, Settings
    from gateway.config.operations import AdminSettings
    from gateway.intake.xmlsafe import DEFAULT_LIMITS
    from gateway.routing.partners import DEFAULT_PARTNER_LIMITS
    from ledger_contract.retention import RetentionPolicy
    from spark_etl.config import DEFAULTS

    expected: dict[str, object] = {f"limits.{key}": getattr(DEFAULT_LIMITS, name) for key, name in LIMIT_KEYS.items()}
    settings = Settings()
    expected["limits.rules_seconds"] = settings.rules_seconds
    for name in (
        "host",
        "port",
        "processes",
        "pin_processes",
        "intake_threads",
        "intake_workers",
        "intake_facts",
        "explain_workers",
        "explain_timeout",
    ):
        expected[f"server.{name}"] = getattr(settings, name)
    expected["exchange.late_reply_window"] = settings.late_reply_window
    expected["exchange.reconcile_interval"] = settings.reconcile_interval
    expected["rules.worker_memory_mb"] = settings.rules_worker_memory_mb
    admin = AdminSettings()
    for name in ("session_ttl", "secure_cookies", "login_attempts", "login_window", "stats_interval"):
        expected[f"admin.{name}"] = getattr(admin, name)
    for name in ("concurrent_requests", "requests_per_second", "burst", "refusal_delay"):
        expected[f"partners.ID.limits.{name}"] = expected[f"defaults.limits.{name}"] = getattr(
            DEFAULT_PARTNER_LIMITS, name
        )
    policy = RetentionPolicy()
    expected.update(
        {
            "ledger.retention.online": policy.default.online,
            "ledger.retention.after": policy.default.after,
            "ledger.retention.tombstones": policy.tombstones,
            "ledger.retention.schedule": policy.schedule,
            "ledger.retention.timezone": policy.timezone,
            "ledger.retention.batch": policy.batch,
            "ledger.retention.enabled": policy.enabled,
        }
    )
    expected.update({f"etl.{name}": value for name, value in DEFAULTS.items()})

    def same(documented: str, value: object) -> bool:
        if isinstance(value, bool):
            return documented.lower() == str(value).lower()
        if isinstance(value, (int, float)):
            try:
                return float(documented.split()[0]) == float(value)
            except ValueError:
                return False
        if isinstance(value, dict):
            return documented == "{}" and not value
        return documented == str(value)

    wrong = {path: (_default(path), value) for path, value in expected.items() if not same(_default(path), value)}
    assert not wrong, f"{PAGE}: documented default != the code's default: {wrong}"


def test_the_reference_is_in_the_site_and_linked():
    assert "configuration.md" in (ROOT / "mkdocs.yml").read_text()
    assert "configuration.md" in (DOCS / "index.md").read_text()
