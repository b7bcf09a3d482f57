"""The hardened parse: no DTD, entities, network or file loads, the tree checked against the limits."""

from __future__ import annotations

import threading

from lxml import etree

from gateway.errors import (
    DocumentTooLargeError,
    NotWellFormedError,
    XMLErrorDetail,
    XMLSecurityError,
)
from gateway.intake.encodings import _decode, _Decoded, _not_well_formed
from gateway.intake.limits import DEFAULT_LIMITS, LIBXML2_MAX_DEPTH, IntakeLimits
from gateway.intake.scan import (
    _DOCTYPE_MESSAGE,
    _check_element_count,
    _check_markup,
    _check_prolog,
    _check_tree,
    _security,
)

# --------------------------------------------------------------------------- parsing

_local = threading.local()


class ExternalLoadRefusedError(Exception):
    """Raised by the intake parser's resolver for any external resource."""


class _RefuseExternal(etree.Resolver):
    """Refuses every external load (DTD subset, entity, anything): raising
    aborts the parse before libxml2's default loader could open a file."""

    def resolve(self, system_url: str, public_id: str, context: object) -> None:
        raise ExternalLoadRefusedError("external resources are never loaded")


def _parser(encoding: str | None, schema: etree.XMLSchema | None = None) -> etree.XMLParser:
    """A hardened parser for this thread (lxml parsers must not be shared), validating against *schema*."""
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    parser = parsers.get((encoding, schema))
    if parser is None:
        parser = etree.XMLParser(
            schema=schema,
            encoding=encoding,
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            dtd_validation=False,
            attribute_defaults=False,
            huge_tree=False,
            recover=False,
            # not collect_ids=False: it makes libxml2 load external DTD subsets (see the module doc)
        )
        parser.resolvers.add(_RefuseExternal())
        parsers[(encoding, schema)] = parser
    return parser


def _too_deep_xpath(max_depth: int) -> etree.XPath:
    cache = getattr(_local, "depth", None)
    if cache is None:
        cache = _local.depth = {}
    xpath = cache.get(max_depth)
    if xpath is None:
        xpath = cache[max_depth] = etree.XPath("(" + "/*" * (max_depth + 1) + ")[1]")
    return xpath


_ENTITY_MESSAGE = (
    "The document references an entity; only the predefined entities (&lt; &gt; &amp; &apos; &quot;) and "
    "character references are accepted."
)


def _syntax_error(log: etree._ListErrorLog, limits: IntakeLimits) -> XMLSecurityError | NotWellFormedError:
    entries = [e for e in log if e.level >= etree.ErrorLevels.ERROR] or list(log)
    for entry in entries:
        if entry.type_name == "ERR_RESOURCE_LIMIT" or "Excessive depth" in entry.message:
            if "depth" in entry.message:
                text = (
                    f"Elements are nested deeper than {min(limits.max_depth, LIBXML2_MAX_DEPTH)} levels, "
                    "the most this gateway accepts."
                )
            else:
                text = "The document exceeds a parser resource limit (a name, text or attribute too large)."
            return _security(text, entry.line or None, entry.column or None)
        if entry.type_name in ("ERR_UNDECLARED_ENTITY", "WAR_UNDECLARED_ENTITY"):
            return _security(_ENTITY_MESSAGE, entry.line or None, entry.column or None)
    details = [
        XMLErrorDetail(e.line or None, e.column or None, None, e.message.strip() or "syntax error")
        for e in entries[: NotWellFormedError.max_errors]
    ]
    if not details:
        details = [XMLErrorDetail(None, None, None, "The document is not well-formed XML.")]
    first = details[0]
    where = f" at line {first.line}, column {first.column}" if first.line else ""
    return NotWellFormedError(
        f"The document is not well-formed XML{where}: {first.message}",
        details,
        omitted=max(0, len(entries) - len(details)),
    )


def parse_document(
    data: bytes,
    limits: IntakeLimits = DEFAULT_LIMITS,
    *,
    declared_charset: str | None = None,
) -> etree._Element:
    """Parse a request body safely and return the root element.

    *declared_charset* is the HTTP ``charset`` parameter, if any (see
    :func:`check_media_type`). Raises :class:`~gateway.errors.DocumentTooLargeError`,
    :class:`~gateway.errors.NotWellFormedError` or
    :class:`~gateway.errors.XMLSecurityError` (see the module docstring for
    what each covers); never anything else for any input bytes.
    """
    return parse_document_text(data, limits, declared_charset=declared_charset)[0]


def parse_document_text(
    data: bytes,
    limits: IntakeLimits = DEFAULT_LIMITS,
    *,
    declared_charset: str | None = None,
) -> tuple[etree._Element, str | None]:
    """:func:`parse_document`, and the document's text as checked on the way (without a byte order
    mark) when it is UTF-8, else None: the caller that needs the text too need not decode it again."""
    decoded, tree_checks = _prepare(data, limits, declared_charset)
    parser = _parser(decoded.override)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError:
        raise _syntax_error(parser.error_log, limits) from None
    except ExternalLoadRefusedError:  # unreachable unless the prolog scan was fooled
        raise _security(_DOCTYPE_MESSAGE) from None
    _finish(root, decoded, limits, tree_checks)
    return root, (decoded.text if decoded.utf8 else None)


def _prepare(data: bytes, limits: IntakeLimits, declared_charset: str | None) -> tuple[_Decoded, int]:
    """Everything checked before libxml2 sees the bytes; returns the decoded text and the tree checks to run."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(f"parse_document needs bytes, not {type(data).__name__}")
    if len(data) > limits.max_bytes:
        raise DocumentTooLargeError(limit=limits.max_bytes)
    if not data:
        raise _not_well_formed("The body is empty; send an XML document.")
    decoded = _decode(data, declared_charset)
    _check_prolog(decoded.text)
    tree_checks = _check_markup(decoded.text, limits)  # first: it refuses most hostile bodies in a few jumps
    _check_element_count(decoded.text, limits.max_elements)
    return decoded, tree_checks


def _finish(root: etree._Element, decoded: _Decoded, limits: IntakeLimits, tree_checks: int) -> None:
    """The checks made on the parsed tree."""
    docinfo = root.getroottree().docinfo
    if docinfo.internalDTD is not None or docinfo.externalDTD is not None or docinfo.system_url:
        raise _security(_DOCTYPE_MESSAGE)  # unreachable unless the prolog scan was fooled
    if limits.max_depth < LIBXML2_MAX_DEPTH:
        too_deep = _too_deep_xpath(limits.max_depth)(root)
        if too_deep:
            raise _security(
                f"Elements are nested deeper than {limits.max_depth} levels, the most this gateway accepts.",
                too_deep[0].sourceline,
            )
    if tree_checks:
        _check_tree(root, decoded.text, limits, tree_checks)
