"""Routes compiled from the ``routes:`` section: every XPath compiled once, every XSLT with file and network
access denied, each plain XPath checked against the route's schema; every problem collected (a
:class:`~gateway.errors.ConfigError` with file and line) rather than the first, so that ``b2bgw routes check``
lists them all, and a route an earlier one shadows refused."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from lxml import etree

from broker_core import DeliveryMode, InvalidDestinationError, JMSError, XMLMessage, parse_destination
from gateway.config.loader import (
    Settings,
    Where,
    check_keys,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
    parse_duration,
)
from gateway.delivery.hooks import parse_route_delivery
from gateway.errors import ConfigError, clip
from gateway.intake.schemas import UBL_NAMESPACES, SchemaRegistry
from gateway.routing.partners import PartnerRegistry
from gateway.routing.routes import (
    _DEFAULT_TIMEOUT,
    SENDER_PARTIES,
    PropertySpec,
    Route,
    RouteTable,
    display_root,
)

__all__ = ["compile_routes", "shadowing_errors"]

_ROUTE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_CLARK = re.compile(r"^\{([^{}\s]+)\}([A-Za-z_][\w.\-]*)$")
_PREFIXED = re.compile(r"^(?:([A-Za-z_][\w.\-]*):)?([A-Za-z_][\w.\-]*)$")
_TYPES = ("string", "double", "long", "int", "boolean")
_RESERVED_PROPERTIES = {"B2BRoute", "B2BDocumentID", "B2BPartner", "B2BRuleWarnings"}
_MAX_TIMEOUT = 300.0
# A location path check_path can verify: child steps, predicates, a final @attr or text().
_SIMPLE_PATH = re.compile(
    r"^/?(?:[A-Za-z_][\w.\-]*:)?[A-Za-z_][\w.\-]*(?:\[[^\]]*\])?"
    r"(?:/(?:(?:@?(?:[A-Za-z_][\w.\-]*:)?[A-Za-z_][\w.\-]*)|text\(\))(?:\[[^\]]*\])?)*$"
)
#: The most XPaths a route's ``idempotency_key`` lists.
_MAX_KEY_XPATHS = 8


def _party_xpath(party: str) -> str:
    """The identifier of the party at *party*: its endpoint id, else its first party identification (the
    schema puts EndpointID before PartyIdentification, so the first non-blank in document order)."""
    return f"({party}/cbc:EndpointID | {party}/cac:PartyIdentification/cbc:ID)[normalize-space()][1]"


def compile_routes(
    settings: Settings,
    registry: SchemaRegistry,
    partners: PartnerRegistry | None = None,
    *,
    check_paths: bool = True,
) -> tuple[RouteTable, list[ConfigError]]:
    """Compile the ``routes:`` section; returns the table of the good routes and every error found.
    *check_paths*: check each plain XPath against the route's schema (off where the serving process did
    it already: the check loads the schema's xmlschema model, which takes seconds)."""
    errors: list[ConfigError] = []
    routes: list[Route] = []
    seen: dict[str, Route] = {}
    base_ns = {**UBL_NAMESPACES, **settings.namespaces}
    for index, item in enumerate(settings.routes):
        where = settings.routes.at(index)
        try:
            route = _compile_route(item, where, settings, registry, partners, base_ns, check_paths)
        except ConfigError as exc:
            errors.append(exc)
            continue
        if route.id in seen:
            errors.append(where.error(f"route id {route.id!r} is already used at line {seen[route.id].where.line}"))
            continue
        seen[route.id] = route
        routes.append(route)
    errors.extend(shadowing_errors(routes))
    return RouteTable(routes), errors


def shadowing_errors(routes: list[Route]) -> list[ConfigError]:
    """A ConfigError for every route an earlier one makes unreachable (for some or all of its partners)."""
    errors = []
    for j, later in enumerate(routes):
        for earlier in routes[:j]:
            if earlier.root != later.root:
                continue
            if earlier.when_text is not None and _normalize(earlier.when_text) != _normalize(later.when_text):
                continue
            if earlier.partners is None:
                common: str = "every partner"
            elif later.partners is None:
                common = ", ".join(sorted(earlier.partners))
            else:
                overlap = earlier.partners & later.partners
                if not overlap:
                    continue
                common = ", ".join(sorted(overlap))
            why = "has no 'when' condition" if earlier.when_text is None else "has the same 'when' condition"
            errors.append(
                later.where.error(
                    f"route {later.id!r} is shadowed by route {earlier.id!r} ({earlier.where}): both take "
                    f"{display_root(later.root)} documents from {common}, and {earlier.id!r} comes first and {why}, "
                    f"so {later.id!r} would never be used for them; give {earlier.id!r} a 'when' condition, "
                    "or split their partners"
                )
            )
            break
    return errors


def _normalize(text: str | None) -> str | None:
    return None if text is None else " ".join(text.split())


def _resolve_root(text: str, where: Where, namespaces: dict[str, str]) -> str:
    m = _CLARK.match(text)
    if m:
        return text
    m = _PREFIXED.match(text)
    if not m:
        raise where.error(f"root {clip(text, 100)!r} must be a Clark name {{namespace}}Name or prefix:Name")
    prefix, local = m.group(1), m.group(2)
    if prefix is None:
        return local
    uri = namespaces.get(prefix)
    if uri is None:
        raise where.error(f"root {text!r} uses the prefix {prefix!r}, which no 'namespaces' entry binds")
    return f"{{{uri}}}{local}"


def _xpath(expr: str, where: Where, namespaces: dict[str, str], what: str, wrap: str | None = None) -> etree.XPath:
    text = f"{wrap}({expr})" if wrap else expr
    try:
        return etree.XPath(text, namespaces=namespaces, smart_strings=False)
    except etree.XPathSyntaxError as exc:
        raise where.error(f"{what}: XPath {clip(expr, 150)!r} does not compile: {clip(str(exc), 150)}") from None
    except etree.XPathError as exc:  # pragma: no cover - other compile errors
        raise where.error(f"{what}: XPath {clip(expr, 150)!r} is not valid: {clip(str(exc), 150)}") from None


def _check_against_schema(
    registry: SchemaRegistry | None, schema: str, expr: str, namespaces: dict[str, str], where: Where, what: str
) -> None:
    """For a plain location path, check that each step exists in the schema."""
    if registry is None or not _SIMPLE_PATH.match(expr.strip()):
        return  # functions, unions, '//'...: compiled, but not checkable against the schema
    problem = registry.check_path(schema, expr, namespaces)
    if problem is not None:
        raise where.error(f"{what}: {problem}")


_XSLT_ACCESS = etree.XSLTAccessControl.DENY_ALL


class _RefuseAll(etree.Resolver):
    def resolve(self, system_url: str, public_id: str, context: Any) -> Any:
        raise ConfigError(
            f"the stylesheet refers to {clip(str(system_url), 200)}; stylesheets may not load other files"
        )


def _compile_xslt(path: Path, where: Where) -> etree.XSLT:
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    parser.resolvers.add(_RefuseAll())
    try:
        doc = etree.fromstring(path.read_bytes(), parser, base_url=path.as_uri())  # includes go to the resolver
        return etree.XSLT(doc, access_control=_XSLT_ACCESS)
    except OSError as exc:
        raise where.error(f"transform {path}: cannot read it: {clip(str(exc), 200)}") from None
    except ConfigError as exc:
        raise where.error(f"transform {path}: {exc.detail}") from None
    except (etree.XMLSyntaxError, etree.XSLTParseError) as exc:
        raise where.error(f"transform {path} does not compile: {clip(str(exc), 300)}") from None


def _compile_route(
    item: Any,
    where: Where,
    settings: Settings,
    registry: SchemaRegistry,
    partners: PartnerRegistry | None,
    base_ns: dict[str, str],
    check_paths: bool = True,
) -> Route:
    spec = expect_mapping(item, where, "a route")
    checked = registry if check_paths else None  # whose paths _check_against_schema checks
    check_keys(
        spec,
        {
            "id",
            "partners",
            "root",
            "when",
            "schema",
            "document_id",
            "namespaces",
            "properties",
            "destination",
            "delivery_mode",
            "priority",
            "time_to_live",
            "exchange",
            "timeout",
            "transform",
            "idempotency_key",
            "rules",
            "deliver",
        },
        "a route",
    )
    route_id = expect_str(
        spec.get("id"),
        spec.at("id") if "id" in spec else spec.where,
        "route id",
        pattern=_ROUTE_ID,
        hint="1-100 letters, digits, '.', '-' or '_'",
    )
    what = f"route {route_id!r}"

    namespaces = dict(base_ns)
    extra_ns = expect_mapping(spec.get("namespaces"), spec.at("namespaces"), f"{what} namespaces")
    for prefix, uri in extra_ns.items():
        namespaces[str(prefix)] = expect_str(uri, extra_ns.at(prefix), f"{what} namespace {prefix!r}")

    # partners
    if "partners" not in spec:
        raise spec.where.error(f"{what} has no 'partners': list the partner ids that may use it, or \"*\"")
    raw_partners = spec["partners"]
    allowed: frozenset[str] | None
    if raw_partners == "*":
        allowed = None
    else:
        plist = expect_list(raw_partners, spec.at("partners"), f"{what} partners")
        names = []
        for i, p in enumerate(plist):
            pid = expect_str(p, plist.at(i), f"{what}: a partner id")
            if partners is not None and pid not in partners:
                known = ", ".join(sorted(partners.partners)) or "none"
                raise plist.at(i).error(f"{what} names partner {pid!r}, which is not configured (partners: {known})")
            names.append(pid)
        if not names:
            raise spec.at("partners").error(f'{what} allows no partner; list some, or "*"')
        allowed = frozenset(names)

    # root and schema
    root = _resolve_root(
        expect_str(spec.get("root"), spec.at("root") if "root" in spec else spec.where, f"{what} root"),
        spec.at("root"),
        namespaces,
    )
    if "schema" in spec:
        schema = expect_str(spec["schema"], spec.at("schema"), f"{what} schema")
        if schema not in registry.names:
            known = ", ".join(registry.names[:12]) or "none"
            raise spec.at("schema").error(f"{what} names schema {schema!r}, which is not configured (schemas: {known})")
        if registry.roots(schema) and root not in registry.roots(schema):
            raise spec.at("root").error(
                f"{what}: schema {schema!r} does not declare the root element {display_root(root)}"
            )
    else:
        found = registry.for_root(root)
        if found is None:
            raise spec.at("root").error(
                f"{what}: no configured schema declares the root element {display_root(root)}; add it under "
                "'schemas:' or name one with 'schema:'"
            )
        schema = found

    # destination and delivery
    dest_text = expect_str(
        spec.get("destination"), spec.at("destination") if "destination" in spec else spec.where, f"{what} destination"
    )
    try:
        destination = parse_destination(dest_text.strip())
    except InvalidDestinationError as exc:
        raise spec.at("destination").error(f"{what}: {exc}") from None
    if destination.is_temporary or not destination.name or any(c.isspace() for c in destination.name):
        raise spec.at("destination").error(
            f"{what}: destination {dest_text!r} must be queue://NAME or topic://NAME with a name without spaces"
        )
    mode_text = str(spec.get("delivery_mode", "persistent")).lower().replace("-", "_")
    if mode_text not in ("persistent", "non_persistent"):
        raise spec.at("delivery_mode").error(f"{what}: delivery_mode must be persistent or non_persistent")
    delivery_mode = DeliveryMode.PERSISTENT if mode_text == "persistent" else DeliveryMode.NON_PERSISTENT
    priority = expect_int(spec.get("priority", 4), spec.at("priority"), f"{what} priority", minimum=0, maximum=9)
    ttl = parse_duration(spec.get("time_to_live", 0), spec.at("time_to_live"), f"{what} time_to_live")

    exchange = str(spec.get("exchange", "one-way")).lower()
    if exchange not in ("one-way", "request-reply"):
        raise spec.at("exchange").error(f"{what}: exchange must be one-way or request-reply, not {exchange!r}")
    request_reply = exchange == "request-reply"
    timeout = _DEFAULT_TIMEOUT
    if "timeout" in spec:
        if not request_reply:
            raise spec.at("timeout").error(f"{what}: 'timeout' is for request-reply routes only")
        timeout = parse_duration(spec["timeout"], spec.at("timeout"), f"{what} timeout")
        if not 0 < timeout <= _MAX_TIMEOUT:
            raise spec.at("timeout").error(f"{what}: timeout must be more than 0 and at most {_MAX_TIMEOUT:.0f} s")
    if request_reply and destination.is_topic:
        raise spec.at("destination").error(f"{what}: a request-reply route sends to a queue, not a topic")

    # XPaths
    when_text = None
    when = None
    if spec.get("when") is not None:
        when_text = expect_str(spec["when"], spec.at("when"), f"{what} when")
        when = _xpath(when_text, spec.at("when"), namespaces, f"{what} when", wrap="boolean")
    doc_id_text = expect_str(spec.get("document_id", "cbc:ID"), spec.at("document_id"), f"{what} document_id")
    doc_id = _xpath(doc_id_text, spec.at("document_id"), namespaces, f"{what} document_id", wrap="string")
    _check_against_schema(checked, schema, doc_id_text, namespaces, spec.at("document_id"), f"{what} document_id")

    key_texts: tuple[str, ...] | None = None
    key_xpaths: tuple[etree.XPath, ...] | None = None
    if spec.get("idempotency_key") is not None:
        kwhere = spec.at("idempotency_key")
        raw_key = spec["idempotency_key"]
        if isinstance(raw_key, str):
            texts = [expect_str(raw_key, kwhere, f"{what} idempotency_key")]
        else:
            klist = expect_list(raw_key, kwhere, f"{what} idempotency_key")
            texts = [expect_str(x, klist.at(i), f"{what} idempotency_key: an XPath") for i, x in enumerate(klist)]
        if not texts:
            raise kwhere.error(
                f"{what}: idempotency_key lists no XPath; list the XPaths whose values identify "
                "a document, or leave it out for the default key"
            )
        if len(texts) > _MAX_KEY_XPATHS:
            raise kwhere.error(f"{what}: idempotency_key lists {len(texts)} XPaths; at most {_MAX_KEY_XPATHS}")
        compiled_keys = []
        for text in texts:
            compiled_keys.append(_xpath(text, kwhere, namespaces, f"{what} idempotency_key", wrap="string"))
            _check_against_schema(checked, schema, text, namespaces, kwhere, f"{what} idempotency_key")
        key_texts, key_xpaths = tuple(texts), tuple(compiled_keys)
    party_path = SENDER_PARTIES.get(root) if key_xpaths is None else None
    party_xpath = None if party_path is None else etree.XPath(_party_xpath(party_path), namespaces=UBL_NAMESPACES)

    properties: list[PropertySpec] = []
    props = expect_mapping(spec.get("properties"), spec.at("properties"), f"{what} properties")
    probe = XMLMessage()
    for name, body in props.items():
        pwhere = props.at(name)
        pname = expect_str(name, pwhere, f"{what}: a property name")
        if pname in _RESERVED_PROPERTIES:
            raise pwhere.error(f"{what}: property {pname!r} is set by the gateway itself; choose another name")
        try:
            probe.set_string_property(pname, "")
        except JMSError as exc:
            raise pwhere.error(f"{what}: {exc}") from None
        if isinstance(body, str):
            xpath_text, kind = body, "string"
        else:
            entry = expect_mapping(body, pwhere, f"{what} property {pname!r}")
            check_keys(entry, {"xpath", "type"}, f"{what} property {pname!r}")
            xpath_text = expect_str(entry.get("xpath"), entry.at("xpath"), f"{what} property {pname!r} xpath")
            kind = str(entry.get("type", "string")).lower()
            if kind not in _TYPES:
                raise entry.at("type").error(
                    f"{what} property {pname!r}: type must be one of {', '.join(_TYPES)}, not {kind!r}"
                )
        compiled = _xpath(xpath_text, pwhere, namespaces, f"{what} property {pname!r}", wrap="string")
        _check_against_schema(checked, schema, xpath_text, namespaces, pwhere, f"{what} property {pname!r}")
        properties.append(PropertySpec(pname, xpath_text, kind, compiled))

    transform_path = None
    transform = None
    if spec.get("transform") is not None:
        transform_path = (
            settings.base_dir / expect_str(spec["transform"], spec.at("transform"), f"{what} transform")
        ).resolve()
        transform = _compile_xslt(transform_path, spec.at("transform"))

    deliver = None
    if spec.get("deliver") is not None:
        if request_reply:
            raise spec.at("deliver").error(
                f"{what}: deliver is for one-way routes (a request-reply route's answer goes back in the exchange)"
            )
        deliver = parse_route_delivery(
            spec["deliver"], spec.at("deliver"), what, partners, settings.base_dir, _compile_xslt
        )

    rule_names: list[str] = []
    rules = expect_list(spec.get("rules"), spec.at("rules"), f"{what} rules")
    configured = [r.name for r in settings.rule_sets]
    for i, item in enumerate(rules):
        name = expect_str(item, rules.at(i), f"{what}: a rule set name")
        if name not in configured:
            raise rules.at(i).error(
                f"{what} names rule set {name!r}, which is not configured under rules.sets "
                f"(rule sets: {', '.join(configured) or 'none'})"
            )
        if name in rule_names:
            raise rules.at(i).error(f"{what} lists rule set {name!r} twice")
        rule_names.append(name)

    return Route(
        id=route_id,
        partners=allowed,
        root=root,
        schema=schema,
        destination=destination,
        delivery_mode=delivery_mode,
        priority=priority,
        time_to_live_ms=int(round(ttl * 1000)),
        request_reply=request_reply,
        timeout=timeout,
        when_text=when_text,
        when=when,
        document_id=doc_id,
        properties=properties,
        transform_path=transform_path,
        transform=transform,
        namespaces=namespaces,
        rules=tuple(rule_names),
        where=where,
        key_xpath_texts=key_texts,
        key_xpaths=key_xpaths,
        sender_party_path=party_path,
        sender_party=party_xpath,
        deliver=deliver,
    )
