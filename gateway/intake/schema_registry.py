"""The schemas the gateway validates against (:class:`SchemaRegistry`), keyed by name and by root element,
compiled once, with every validation error explained in plain words."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import xmlschema
from lxml import etree
from xmlschema.validators.exceptions import XMLSchemaChildrenValidationError

from gateway.errors import (
    ConfigError,
    SchemaValidationError,
    UnknownSchemaError,
    XMLErrorDetail,
    clip,
)
from gateway.intake.locations import _decode_source, _locate, _prefixed, element_path
from gateway.intake.schema_loading import (
    _XMLSCHEMA_OWN_DIR,
    UBL_NAMESPACES,
    XSD_NS,
    LocalSchemaResolver,
    _AllowedDirs,
    _guarded_opener,
)
from gateway.intake.schema_messages import plain_message
from gateway.intake.schema_paths import check_path
from xml_schemas import SCHEMAS_DIR, UBL_21_DIR

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- registry


@dataclass(eq=False)
class _Entry:
    name: str
    path: Path
    version: str
    group: str
    roots: frozenset[str]
    lxml: etree.XMLSchema | None = None
    compile_seconds: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class SchemaRegistry:
    """The schemas the gateway validates against, compiled once.

    *allowed_dirs* are the only directories schema files are read from (the
    vendored :mod:`xml_schemas` by default). *max_errors* caps the errors one
    :class:`~gateway.errors.SchemaValidationError` lists. *detail_max_elements*
    is the largest document (in elements) whose errors are collected with
    xmlschema, whose cost grows with the document; larger ones get libxml2's errors.
    """

    def __init__(
        self,
        allowed_dirs: Iterable[str | Path] = (SCHEMAS_DIR,),
        *,
        max_errors: int = 50,
        detail_max_elements: int = 10_000,
    ) -> None:
        self._allowed = _AllowedDirs(Path(d) for d in allowed_dirs)
        self._xmlschema_allowed = _AllowedDirs([*self._allowed.dirs, _XMLSCHEMA_OWN_DIR])
        self.max_errors = max_errors
        self.detail_max_elements = detail_max_elements
        self._entries: dict[str, _Entry] = {}
        self._by_root: dict[str, str] = {}
        self._bundles: dict[tuple[str, str], tuple[Any, frozenset[str]]] = {}
        self._bundle_lock = threading.RLock()

    # ----------------------------------------------------------------- registration

    def register(
        self,
        name: str,
        xsd_path: str | Path,
        *,
        version: str = "1.0",
        group: str | None = None,
        roots: Iterable[str] | None = None,
    ) -> None:
        """Register the schema file *xsd_path* under *name* (nothing is compiled yet).

        ``version="1.1"`` makes it an XSD 1.1 schema, validated with xmlschema
        only. Schemas of one *group* (default: their own name) are built by
        xmlschema as one bundle; put schemas that share imports in one group
        (as :meth:`register_ubl21` does). *roots* are the Clark names of the
        root elements it accepts; by default the global elements its file
        declares. A root already registered keeps its first schema for
        :meth:`for_root`. Raises :class:`~gateway.errors.ConfigError` for a
        file that is missing, outside the allowed directories or unreadable,
        or a duplicate name.
        """
        if version not in ("1.0", "1.1"):
            raise ConfigError(f"schema {name!r}: version must be '1.0' or '1.1', not {version!r}")
        if name in self._entries:
            raise ConfigError(f"schema {name!r} is already registered", file=str(xsd_path))
        path = self._allowed.check_path(Path(xsd_path).absolute())
        if path is None:
            raise ConfigError(
                f"schema {name!r}: {xsd_path} is outside the allowed schema directories "
                f"({', '.join(str(d) for d in self._allowed.dirs)})",
                file=str(xsd_path),
            )
        if not path.is_file():
            raise ConfigError(f"schema {name!r}: no such file", file=str(path))
        if isinstance(roots, str):
            roots = [roots]
        root_names = frozenset(roots) if roots is not None else self._declared_roots(name, path)
        entry = _Entry(name, path, version, group or name, root_names)
        self._entries[name] = entry
        for qname in sorted(root_names):
            self._by_root.setdefault(qname, name)

    def register_ubl21(self, documents: Iterable[str] | None = None) -> list[str]:
        """Register the UBL 2.1 maindoc schemas as ``"ubl-2.1/<Document>"``.

        All 65 by default, or the *documents* named (``["Order", "Invoice"]``);
        they form the group ``"ubl-2.1"``. Returns the names registered.
        """
        available = {
            path.name[len("UBL-") : -len("-2.1.xsd")]: path
            for path in sorted((UBL_21_DIR / "maindoc").glob("UBL-*-2.1.xsd"))
        }
        wanted = list(available) if documents is None else list(dict.fromkeys(documents))
        missing = [d for d in wanted if d not in available]
        if missing:
            raise UnknownSchemaError(f"no UBL 2.1 maindoc schema for: {clip(', '.join(missing), 200)}")
        names = []
        for document in wanted:
            name = f"ubl-2.1/{document}"
            self.register(name, available[document], group="ubl-2.1")
            names.append(name)
        return names

    @classmethod
    def ubl21(cls, documents: Iterable[str] | None = None, **kwargs: Any) -> SchemaRegistry:
        """A registry with the UBL 2.1 maindoc schemas registered (not compiled)."""
        registry = cls(**kwargs)
        registry.register_ubl21(documents)
        return registry

    def _schema_parser(self) -> tuple[etree.XMLParser, LocalSchemaResolver]:
        resolver = LocalSchemaResolver(self._allowed.dirs)
        parser = etree.XMLParser(no_network=True, resolve_entities=False, load_dtd=False, huge_tree=False)
        parser.resolvers.add(resolver)
        return parser, resolver

    def _declared_roots(self, name: str, path: Path) -> frozenset[str]:
        parser, resolver = self._schema_parser()
        try:
            doc = etree.parse(str(path), parser)
        except (etree.XMLSyntaxError, OSError, LocalSchemaResolver.RefusedError) as exc:
            why = clip(str(exc), 200)
            if resolver.refused:
                why = f"refused to load {', '.join(resolver.refused[:3])}: only local files under the allowed schema directories are read"
            raise ConfigError(f"schema {name!r} is not readable: {why}", file=str(path)) from None
        schema = doc.getroot()
        tns = schema.get("targetNamespace")
        return frozenset(
            f"{{{tns}}}{el.get('name')}" if tns else el.get("name")
            for el in schema.iterchildren(f"{{{XSD_NS}}}element")
            if el.get("name")
        )

    # ----------------------------------------------------------------- look-ups

    @property
    def names(self) -> list[str]:
        """The registered schema names, in registration order."""
        return list(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries or key in self._by_root

    def __len__(self) -> int:
        return len(self._entries)

    def for_root(self, qname: str) -> str | None:
        """The name of the schema registered for root element *qname* (Clark name), or None."""
        return self._by_root.get(qname)

    def roots(self, name: str) -> frozenset[str]:
        """The Clark names of the root elements schema *name* accepts."""
        return self._entry(name).roots

    def _entry(self, key: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None and key in self._by_root:
            entry = self._entries[self._by_root[key]]
        if entry is None:
            known = ", ".join(list(self._entries)[:10]) + (", ..." if len(self._entries) > 10 else "")
            raise UnknownSchemaError(
                f"no schema is registered as {clip(str(key), 200)!r} (registered: {known or 'none'})"
            )
        return entry

    # ----------------------------------------------------------------- compiling

    def compile(self, names: Iterable[str] | None = None, *, details: bool = True) -> dict[str, float]:
        """Compile the schemas *names* (all registered by default) now.

        Compiles each XSD 1.0 schema with lxml and, with *details* (or for an
        XSD 1.1 schema), builds the xmlschema bundle of its group with these
        schemas (and any already in it), so that neither happens on a
        request. Returns the seconds spent per schema name and per bundle
        built (keys ``"xmlschema:<group>"``). Raises
        :class:`~gateway.errors.UnknownSchemaError` for a name not registered
        and :class:`~gateway.errors.ConfigError` for a schema that does not
        compile.
        """
        entries = [self._entry(n) for n in (self.names if names is None else names)]
        timings: dict[str, float] = {}
        for entry in entries:
            if entry.version == "1.0":
                self._lxml_schema(entry)
                timings[entry.name] = entry.compile_seconds or 0.0
        wanted: dict[tuple[str, str], list[_Entry]] = {}
        for entry in entries:
            if details or entry.version == "1.1":
                wanted.setdefault((entry.group, entry.version), []).append(entry)
        for key, members in wanted.items():
            current = self._bundles.get(key)
            if current is not None and {e.name for e in members} <= current[1]:
                continue  # already built with them
            start = time.perf_counter()
            self._bundle(*members)
            timings[f"xmlschema:{key[0]}"] = time.perf_counter() - start
        return timings

    def _lxml_schema(self, entry: _Entry) -> etree.XMLSchema:
        schema = entry.lxml
        if schema is not None:
            return schema
        with entry.lock:
            if entry.lxml is None:
                start = time.perf_counter()
                parser, resolver = self._schema_parser()
                try:
                    entry.lxml = etree.XMLSchema(etree.parse(str(entry.path), parser))
                except (
                    etree.XMLSchemaParseError,
                    etree.XMLSyntaxError,
                    OSError,
                    LocalSchemaResolver.RefusedError,
                ) as exc:
                    why = clip(str(exc), 300)
                    if resolver.refused:
                        why += f" (refused to load {', '.join(resolver.refused[:3])}: only local files under the allowed schema directories are read)"
                    raise ConfigError(f"schema {entry.name!r} does not compile: {why}", file=str(entry.path)) from None
                entry.compile_seconds = time.perf_counter() - start
            return entry.lxml

    def _bundle(self, *entries: _Entry) -> Any:
        """The xmlschema schema of the group of *entries* (one group), containing them.

        A group's bundle holds the members in use (compiled or asked for), not
        every registered one: building all the UBL maindocs takes noticeably
        longer than the handful a gateway accepts. Asking for a member not yet
        in it rebuilds the bundle with it added (once).
        """
        key = (entries[0].group, entries[0].version)
        names = {e.name for e in entries}
        current = self._bundles.get(key)
        if current is not None and names <= current[1]:
            return current[0]
        with self._bundle_lock:
            current = self._bundles.get(key)
            if current is not None and names <= current[1]:
                return current[0]
            members = names | (current[1] if current is not None else set())
            sources = [str(e.path) for e in self._entries.values() if e.name in members]
            group, version = key
            cls = xmlschema.XMLSchema11 if version == "1.1" else xmlschema.XMLSchema10
            try:
                bundle = cls(
                    sources if len(sources) > 1 else sources[0],
                    allow="local",
                    defuse="always",
                    opener=_guarded_opener(self._xmlschema_allowed),
                    timeout=5,
                )
            except (xmlschema.XMLSchemaException, OSError, SyntaxError) as exc:
                raise ConfigError(
                    f"schema group {group!r} does not build with xmlschema: {clip(str(exc), 300)}",
                    file=sources[0],
                ) from None
            self._bundles[key] = (bundle, frozenset(members))
            return bundle

    def xmlschema(self, schema: str) -> Any:
        """The xmlschema schema object that holds *schema* (built if need be)."""
        return self._bundle(self._entry(schema))

    # ----------------------------------------------------------------- validating

    def validate(
        self,
        root: etree._Element,
        schema: str | None = None,
        *,
        source: bytes | None = None,
    ) -> None:
        """Validate the document of *root*; raise SchemaValidationError if invalid.

        *schema* is a schema name or a root Clark name; by default the schema
        registered for ``root.tag``, and a document whose root has none is
        invalid. Raises :class:`~gateway.errors.UnknownSchemaError` for a
        *schema* that is not registered. Pass the received bytes as *source*
        to get columns in the errors.
        """
        if schema is None:
            name = self._by_root.get(root.tag)
            if name is None:
                message = (
                    f"No schema is registered for the root element {_display(root)}; "
                    "this document type is not accepted here."
                )
                raise SchemaValidationError(message, self._with_positions(root, source, [(root, message)]))
            entry = self._entries[name]
        else:
            entry = self._entry(schema)

        if entry.roots and root.tag not in entry.roots:
            expected = " or ".join(sorted(entry.roots)[:3])
            message = f"The root element is {_display(root)} but schema {entry.name!r} expects {expected}."
            raise SchemaValidationError(
                message, self._with_positions(root, source, [(root, message)]), schema=entry.name
            )

        if entry.version == "1.1":
            self._validate_xmlschema_only(entry, root, source)
            return

        xsd = self._lxml_schema(entry)
        with entry.lock:  # the schema's error_log is shared by its callers
            if xsd.validate(root):
                return
            lxml_log = [(e.line, getattr(e, "path", None), e.message) for e in xsd.error_log]
        self._raise_invalid(entry, root, source, lxml_log)

    def is_valid(self, root: etree._Element, schema: str | None = None) -> bool:
        """True if :meth:`validate` would pass; collects no error detail."""
        if schema is None:
            name = self._by_root.get(root.tag)
            if name is None:
                return False
            entry = self._entries[name]
        else:
            entry = self._entry(schema)
        if entry.roots and root.tag not in entry.roots:
            return False
        if entry.version == "1.1":
            return bool(self._bundle(entry).is_valid(root, use_location_hints=False))
        xsd = self._lxml_schema(entry)
        with entry.lock:
            return bool(xsd.validate(root))

    def _validate_xmlschema_only(self, entry: _Entry, root: etree._Element, source: bytes | None) -> None:
        found, total = self._xmlschema_errors(entry, root)
        if total:
            details = self._details_from_xmlschema(root, source, found)
            raise SchemaValidationError(
                _summary(details, entry.name, total), details, omitted=total - len(details), schema=entry.name
            )

    def _xmlschema_errors(self, entry: _Entry, root: etree._Element) -> tuple[list[Any], int]:
        """The first max_errors xmlschema errors of the document, and how many there are."""
        bundle = self._bundle(entry)
        kept: list[Any] = []
        total = 0
        for err in bundle.iter_errors(root, use_location_hints=False):
            total += 1
            if len(kept) < self.max_errors:
                kept.append(err)
        return kept, total

    def _raise_invalid(
        self,
        entry: _Entry,
        root: etree._Element,
        source: bytes | None,
        lxml_log: list[tuple[int, str | None, str]],
    ) -> None:
        raise self._explained(entry, root, source, lxml_log)

    def _explained(
        self,
        entry: _Entry,
        root: etree._Element,
        source: bytes | None,
        lxml_log: list[tuple[int, str | None, str]],
        on_libxml2: Callable[[SchemaValidationError], None] | None = None,
    ) -> SchemaValidationError:
        """The error report of an invalid document: xmlschema's (every error, with a reason) for
        documents up to detail_max_elements elements, else libxml2's. *on_libxml2* gets libxml2's
        report first, before xmlschema starts (the worker that explains documents sends it on, for
        the case its time runs out: see gateway.intake.explainer)."""
        libxml2 = self._libxml2_error(entry, root, source, lxml_log)
        if on_libxml2 is not None:
            on_libxml2(libxml2)
        if int(root.xpath("count(//*)")) <= self.detail_max_elements:
            try:
                found, total = self._xmlschema_errors(entry, root)
                details = self._details_from_xmlschema(root, source, found)
            except Exception:  # the detail is best effort; libxml2's log remains
                log.warning("xmlschema failed to detail the errors of a %s document", entry.name, exc_info=True)
                details = []
            if details:
                return SchemaValidationError(
                    _summary(details, entry.name, total), details, omitted=total - len(details), schema=entry.name
                )
        return libxml2  # large document, or xmlschema saw no error (it should not disagree)

    def _libxml2_error(
        self,
        entry: _Entry,
        root: etree._Element,
        source: bytes | None,
        lxml_log: list[tuple[int, str | None, str]],
    ) -> SchemaValidationError:
        details = self._details_from_lxml(root, source, lxml_log)
        total = max(len(lxml_log), len(details))
        if not details:
            details = self._with_positions(root, source, [(root, "The document is not valid against its schema.")])
            total = 1
        return SchemaValidationError(
            _summary(details, entry.name, total), details, omitted=total - len(details), schema=entry.name
        )

    def libxml2_error(self, root: etree._Element, schema: str, *, source: bytes | None = None) -> SchemaValidationError:
        """libxml2's report of the invalid document *root* (lines, columns, paths, messages), without
        xmlschema: for documents small enough that validating their tree again costs little."""
        entry = self._entry(schema)
        xsd = self._lxml_schema(entry)
        with entry.lock:
            xsd.validate(root)
            lxml_log = [(e.line, getattr(e, "path", None), e.message) for e in xsd.error_log]
        return self._libxml2_error(entry, root, source, lxml_log)

    def explain(
        self,
        root: etree._Element,
        schema: str,
        *,
        source: bytes | None = None,
        on_libxml2: Callable[[SchemaValidationError], None] | None = None,
    ) -> SchemaValidationError | None:
        """The full report of the invalid document *root* (None if it is valid): what :meth:`validate`
        raises, and libxml2's report given to *on_libxml2* before xmlschema's work starts."""
        entry = self._entry(schema)
        if entry.version == "1.1":
            try:
                self._validate_xmlschema_only(entry, root, source)
            except SchemaValidationError as exc:
                return exc
            return None
        xsd = self._lxml_schema(entry)
        with entry.lock:
            if xsd.validate(root):
                return None
            lxml_log = [(e.line, getattr(e, "path", None), e.message) for e in xsd.error_log]
        return self._explained(entry, root, source, lxml_log, on_libxml2)

    def streamed_error(
        self, schema: str, entries: list[Any], *, complete: bool = True, nsmap: Mapping[str | None, str] | None = None
    ) -> SchemaValidationError:
        """The report made of the errors libxml2 gave while validating a document as it parsed it
        (:func:`gateway.intake.xmlsafe.parse_and_validate`): messages without positions, which the
        streaming validator does not know. *complete* False: the validation stopped after these."""
        entry = self._entry(schema)
        details = [
            XMLErrorDetail(e.line or None, e.column or None, None, _prefixed(e.message.strip(), nsmap or {}))
            for e in entries[: self.max_errors]
        ]
        if not details:
            details = [XMLErrorDetail(None, None, None, "The document is not valid against its schema.")]
        total = max(len(entries), len(details))
        detail = _summary(details, entry.name, total)
        if not complete:
            detail = detail.replace(f"({total} errors;", f"(at least {total} errors;", 1)
        return SchemaValidationError(detail, details, omitted=total - len(details), schema=entry.name)

    def lxml_schema(self, schema: str) -> etree.XMLSchema | None:
        """The compiled lxml schema of *schema* (a name or a root Clark name); None for XSD 1.1."""
        entry = self._entry(schema)
        return None if entry.version == "1.1" else self._lxml_schema(entry)

    def registrations(self) -> dict[str, Any]:
        """What rebuilds this registry elsewhere (:meth:`from_registrations`): plain data."""
        return {
            "allowed_dirs": [str(d) for d in self._allowed.dirs],
            "max_errors": self.max_errors,
            "detail_max_elements": self.detail_max_elements,
            "schemas": [
                {"name": e.name, "path": str(e.path), "version": e.version, "group": e.group, "roots": sorted(e.roots)}
                for e in self._entries.values()
            ],
        }

    @classmethod
    def from_registrations(cls, data: Mapping[str, Any]) -> SchemaRegistry:
        """A registry with the schemas of :meth:`registrations` registered (not compiled)."""
        registry = cls(
            data["allowed_dirs"], max_errors=data["max_errors"], detail_max_elements=data["detail_max_elements"]
        )
        for item in data["schemas"]:
            registry.register(
                item["name"], item["path"], version=item["version"], group=item["group"], roots=item["roots"]
            )
        return registry

    def _details_from_xmlschema(
        self, root: etree._Element, source: bytes | None, found: list[Any]
    ) -> list[XMLErrorDetail]:
        located: list[tuple[etree._Element | None, str]] = []
        for err in found:
            el = getattr(err, "elem", None)
            if isinstance(err, XMLSchemaChildrenValidationError):
                child = getattr(err, "invalid_child", None)
                if child is not None:
                    el = child
            message = plain_message(err)
            if not isinstance(el, etree._Element):
                el = None
            located.append((el, str(message)))
        details = self._with_positions(root, source, located)
        # xmlschema reports a content-model error after the element's children: put them in document order
        details.sort(key=lambda d: (d.line is None, d.line or 0, d.column or 0))
        return details

    def _details_from_lxml(
        self, root: etree._Element, source: bytes | None, lxml_log: list[tuple[int, str | None, str]]
    ) -> list[XMLErrorDetail]:
        nsmap = root.nsmap
        prefixes = {p: uri for p, uri in nsmap.items() if p}
        located: list[tuple[etree._Element | None, str]] = []
        fallback: dict[int, tuple[int, str | None]] = {}
        for line, path, message in lxml_log[: self.max_errors]:
            el = None
            if path:
                try:
                    hits = root.getroottree().xpath(path, namespaces=prefixes)
                    if len(hits) == 1 and isinstance(hits[0], etree._Element):
                        el = hits[0]
                except etree.Error:
                    el = None
            if el is None:
                fallback[len(located)] = (line, path)
            located.append((el, _prefixed(message.strip(), nsmap)))
        details = self._with_positions(root, source, located)
        for index, (line, path) in fallback.items():
            d = details[index]
            details[index] = XMLErrorDetail(line or None, None, path, d.message)
        return details

    def _with_positions(
        self,
        root: etree._Element,
        source: bytes | None,
        located: list[tuple[etree._Element | None, str]],
    ) -> list[XMLErrorDetail]:
        positions: dict[etree._Element, tuple[int, int]] = {}
        wanted = {el for el, _ in located if el is not None}
        if source is not None and wanted:
            document = root.getroottree().getroot()  # the text's start tags count from the top
            text = _decode_source(document, source)
            if text is not None:
                positions = _locate(document, text, wanted)
        details = []
        for el, message in located:
            if el is None:
                details.append(XMLErrorDetail(None, None, None, message))
                continue
            line, column = positions.get(el, (el.sourceline, None))
            details.append(XMLErrorDetail(line, column, element_path(el), message))
        return details

    # ----------------------------------------------------------------- paths

    def check_path(self, schema: str, path: str, namespaces: Mapping[str, str] | None = None) -> str | None:
        """Check that an XPath's child steps name elements *schema* declares (see
        :func:`gateway.intake.schema_paths.check_path`): None when every step exists, else a message naming
        the first step that does not."""
        entry = self._entry(schema)
        return check_path(
            self._bundle(entry), entry.name, entry.roots, path, UBL_NAMESPACES if namespaces is None else namespaces
        )

    def element_exists(self, schema: str, path: str, namespaces: Mapping[str, str] | None = None) -> bool:
        """True if :meth:`check_path` finds every step of *path* in the schema."""
        return self.check_path(schema, path, namespaces) is None


def _display(el: etree._Element) -> str:
    qname = etree.QName(el)
    name = f"{el.prefix}:{qname.localname}" if el.prefix else qname.localname
    return f"{name} ({{{qname.namespace}}}{qname.localname})" if qname.namespace else name


def _summary(details: list[XMLErrorDetail], schema: str, total: int) -> str:
    first = details[0]
    where = f" at line {first.line}" if first.line else ""
    count = f"{total} errors" if total > 1 else "1 error"
    return f"The document is not valid against schema {schema!r} ({count}; first{where}: {first.message})"
