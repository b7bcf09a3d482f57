"""Turn :class:`~gateway.config.loader.Settings` into the working parts: the schema
registry (compiled), the partner registry, the route table and the business
rule sets (compiled).

:func:`assemble` collects every problem as a
:class:`~gateway.errors.ConfigError` with file and line instead of stopping
at the first, so ``b2bgw routes check`` can report them all;
:func:`assemble_or_raise` is what the server uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from gateway.config.loader import Settings
from gateway.errors import ConfigError
from gateway.intake.schemas import SchemaRegistry
from gateway.routing.partners import PartnerRegistry
from gateway.routing.route_compiler import compile_routes
from gateway.routing.routes import RouteTable
from gateway.rules.rulesets import RuleBook, build_rule_book
from xml_schemas import SCHEMAS_DIR

__all__ = ["Assembly", "assemble", "assemble_or_raise", "build_registry"]

log = logging.getLogger(__name__)


@dataclass
class Assembly:
    settings: Settings
    registry: SchemaRegistry
    partners: PartnerRegistry
    routes: RouteTable
    errors: list[ConfigError] = field(default_factory=list)
    #: the business rule sets (``rules.sets``), compiled
    rules: RuleBook = field(default_factory=RuleBook)


def build_registry(settings: Settings, errors: list[ConfigError]) -> SchemaRegistry:
    """The schema registry of the ``schemas:`` section, compiled (lxml and xmlschema)."""
    dirs = [SCHEMAS_DIR, *settings.schema_dirs, *{f.path.parent for f in settings.schema_files}]
    registry = SchemaRegistry(dirs)
    try:
        if settings.ubl_documents:
            registry.register_ubl21(settings.ubl_documents)
    except ConfigError as exc:
        errors.append(ConfigError(exc.detail, file=settings.where.file, line=None))
    for entry in settings.schema_files:
        try:
            registry.register(entry.name, entry.path, version=entry.version, group=entry.group)
        except ConfigError as exc:
            errors.append(entry.where.error(exc.detail))
    failed = False
    for name in registry.names:
        try:
            registry.compile([name], details=False)
        except ConfigError as exc:
            failed = True
            errors.append(ConfigError(exc.detail, file=exc.file or settings.where.file, line=exc.line))
    if failed:
        return registry
    try:
        registry.compile(details=True)  # xmlschema bundles: the failure path, XSD 1.1, check_path
    except ConfigError as exc:
        errors.append(ConfigError(exc.detail, file=exc.file or settings.where.file, line=exc.line))
    return registry


def assemble(settings: Settings, *, registry: SchemaRegistry | None = None) -> Assembly:
    """Build everything the settings describe; ``errors`` lists what is wrong."""
    errors: list[ConfigError] = []
    if registry is None:
        registry = build_registry(settings, errors)
    try:
        partners = PartnerRegistry.from_settings(settings)
    except ConfigError as exc:
        errors.append(exc)
        partners = PartnerRegistry({}, {})
    routes, route_errors = compile_routes(settings, registry, partners)
    errors.extend(route_errors)
    rules = build_rule_book(settings, errors)
    return Assembly(settings, registry, partners, routes, errors, rules)


def assemble_or_raise(settings: Settings, *, registry: SchemaRegistry | None = None) -> Assembly:
    """Like :func:`assemble`, raising the first error (after logging all of them)."""
    assembly = assemble(settings, registry=registry)
    if assembly.errors:
        for err in assembly.errors:
            log.error("configuration error: %s", err)
        first = assembly.errors[0]
        more = len(assembly.errors) - 1
        if more:
            raise ConfigError(
                f"{first.detail} (and {more} more: run `b2bgw routes check`)", file=first.file, line=first.line
            )
        raise first
    return assembly
