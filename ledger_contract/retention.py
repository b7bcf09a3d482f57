"""The ledger's retention policy: how long documents stay online, and what happens to them then.

The gateway reads it from its configuration (``ledger.retention``, see :mod:`gateway.config.retention`); the
archive job (:mod:`spark_etl.archive`) applies it. Only documents in a final status
(:data:`ledger_contract.tables.FINAL_STATUSES`: delivered, replied, failed) are ever due, ``online`` after their
last status change; ``accepted`` and ``dead_lettered`` documents stay online whatever their age (they still have
something to happen).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "AFTER",
    "DEFAULT_BATCH",
    "DEFAULT_ONLINE",
    "DEFAULT_SCHEDULE",
    "DEFAULT_TOMBSTONES",
    "PolicyClass",
    "RetentionPolicy",
    "Rule",
]

#: What happens to a document once its time online is over.
AFTER = ("archive", "purge")
DEFAULT_ONLINE = 90 * 86400.0
DEFAULT_TOMBSTONES = 400 * 86400.0
DEFAULT_SCHEDULE = "30 3 * * *"
DEFAULT_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Rule:
    """How long a document stays online (s), and what happens then."""

    online: float
    after: str

    @property
    def online_ms(self) -> int:
        return int(self.online * 1000)


@dataclass(frozen=True, slots=True)
class PolicyClass:
    """Documents under one rule: those of ``routes`` (a route rule), or of ``doc_types`` whose route has no
    rule of its own, or (``default``) every other. ``except_routes`` / ``except_types``: the routes and types
    that have rules of their own."""

    name: str
    rule: Rule
    routes: tuple[str, ...] = ()
    doc_types: tuple[str, ...] = ()
    except_routes: tuple[str, ...] = ()
    except_types: tuple[str, ...] = ()
    default: bool = False


@dataclass(frozen=True)
class RetentionPolicy:
    """The checked ``ledger.retention`` section."""

    default: Rule = Rule(DEFAULT_ONLINE, "archive")
    routes: dict[str, Rule] = field(default_factory=dict)
    document_types: dict[str, Rule] = field(default_factory=dict)
    #: how long tombstones are kept after the purge (s); None: for ever
    tombstones: float | None = DEFAULT_TOMBSTONES
    #: the archive's root directory; None: the warehouse's (``etl.warehouse``)
    archive: str | None = None
    schedule: str = DEFAULT_SCHEDULE
    timezone: str = "UTC"
    batch: int = DEFAULT_BATCH
    enabled: bool = True

    def rule_for(self, route: str, doc_type: str) -> Rule:
        """The rule a document of *route* and *doc_type* is under (route, else type, else the default)."""
        rule = self.routes.get(route)
        if rule is None:
            rule = self.document_types.get(doc_type, self.default)
        return rule

    @property
    def needs_archive(self) -> bool:
        return any(
            rule.after == "archive" for rule in (self.default, *self.routes.values(), *self.document_types.values())
        )

    def classes(self) -> list[PolicyClass]:
        """The policy as disjoint classes of documents, one per distinct rule and kind of match; each class's
        name changes whenever what it holds does (the archive job's scan cursors are kept per name)."""
        routes = tuple(sorted(self.routes))
        types = tuple(sorted(self.document_types))
        out: list[PolicyClass] = []
        for rule in sorted(set(self.routes.values()), key=lambda r: (r.online, r.after)):
            members = tuple(r for r in routes if self.routes[r] == rule)
            out.append(PolicyClass(_name("routes", rule, members), rule, routes=members))
        for rule in sorted(set(self.document_types.values()), key=lambda r: (r.online, r.after)):
            members = tuple(t for t in types if self.document_types[t] == rule)
            out.append(
                PolicyClass(
                    _name("types", rule, members + ("|",) + routes), rule, doc_types=members, except_routes=routes
                )
            )
        out.append(
            PolicyClass(
                _name("default", self.default, routes + ("|",) + types),
                self.default,
                except_routes=routes,
                except_types=types,
                default=True,
            )
        )
        return out


def _name(kind: str, rule: Rule, members: tuple[str, ...]) -> str:
    digest = hashlib.sha256("\x1f".join((kind, repr(rule.online), rule.after, *members)).encode()).hexdigest()
    return f"{kind}-{digest[:16]}"
