"""Safe intake of XML request bodies: size, media type, encoding, parsing.

A partner's document goes through, in order:

1. :func:`read_body`: the streamed body, refused with
   :class:`~gateway.errors.DocumentTooLargeError` as soon as it passes
   ``max_bytes`` (nothing past the limit plus one chunk is ever held).
2. :func:`check_media_type`: ``application/xml``, ``text/xml`` or
   ``application/*+xml``; returns the ``charset`` parameter, if any.
3. :func:`parse_document`: the bytes to an lxml element tree, hardened:

   * Encoding. A UTF-8 or UTF-16 byte order mark, the XML declaration's
     ``encoding`` and the HTTP ``charset`` must agree (UTF-16 with either
     byte order agrees with "UTF-16"); a conflict, an unknown or unsupported
     encoding, or bytes that do not decode in the encoding so chosen raise
     :class:`~gateway.errors.NotWellFormedError` naming the encodings. The
     XML declaration wins when there is one (they agree or we refuse); with
     none, the HTTP charset applies, else UTF-8. The parser is then told that
     encoding explicitly, so Python's check and libxml2 read the same text.
   * No DTD at all. A B2B document has no business carrying a DOCTYPE, so
     one in the prolog is refused with :class:`~gateway.errors.XMLSecurityError`
     before libxml2 sees the bytes: nothing is declared, expanded or fetched.
     Behind it, the parser runs with ``resolve_entities=False,
     no_network=True, load_dtd=False, huge_tree=False`` and a resolver that
     refuses every external load, so no file is ever opened; and the parsed
     tree is checked again for a DTD. Undeclared entity references are
     refused too. XInclude is never processed (nothing here calls
     ``xinclude()``). Note: lxml's ``collect_ids=False`` is deliberately not
     used: with lxml 6.1 / libxml2 2.14 it makes libxml2 read an external DTD
     subset and external parameter entities from local files despite
     ``load_dtd=False`` (``no_network`` only stops URLs).
   * Limits. ``max_depth`` is enforced by libxml2 itself up to its built-in
     256 levels (its limit without ``XML_PARSE_HUGE``, which we never set);
     a smaller limit is checked after the parse with one compiled XPath (~6 us).
     ``max_elements`` is checked *before* parsing so a flood of tiny elements
     never becomes a tree: a document of ``n`` characters holds at most
     ``n / 4`` elements (``<a/>``), so only a document longer than
     ``4 * max_elements`` is counted at all (a C-speed upper bound first,
     then, if that is over, an exact count skipping comments, CDATA and PIs).

   The hot path for an ordinary UTF-8 document is therefore: one ``decode``
   (validity check, ~1 us for 14 KB), one regex over the prolog, the lxml parse
   (thread-local parser, ~100 us for the 14 KB UBL Order example) and a docinfo
   check (~0.3 us).

Everything these functions put in an error is bounded (see
:mod:`gateway.errors`) and never contains entity expansions or the content of
any file: none is ever loaded.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections.abc import AsyncIterable
from dataclasses import dataclass

from lxml import etree

from .errors import (
    DocumentTooLargeError,
    NotWellFormedError,
    UnsupportedMediaTypeError,
    XMLErrorDetail,
    XMLSecurityError,
    clip,
)

__all__ = [
    "ACCEPTED_MEDIA_TYPES",
    "DEFAULT_LIMITS",
    "IntakeLimits",
    "LIBXML2_MAX_DEPTH",
    "SUPPORTED_ENCODINGS",
    "check_media_type",
    "parse_document",
    "parse_document_text",
    "read_body",
]

#: The nesting depth libxml2 allows when ``XML_PARSE_HUGE`` is off (always, here).
LIBXML2_MAX_DEPTH = 256

#: What :func:`check_media_type` accepts (for messages and docs).
ACCEPTED_MEDIA_TYPES = ("application/xml", "text/xml", "application/*+xml")


@dataclass(frozen=True, slots=True)
class IntakeLimits:
    """Limits applied to one request body.

    ``max_bytes`` (10 MiB): the largest body accepted.

    ``max_depth`` (256): the deepest element nesting accepted (the root is
    level 1). At most 256, libxml2's own limit without ``huge_tree``: a deeper
    limit could not be honoured. UBL documents nest about 10 levels deep.

    ``max_elements`` (500,000): the most elements accepted. An lxml tree costs
    about 120 bytes per element, so this caps the tree at ~60 MB of nodes. A
    realistic UBL document spends 30-45 bytes per element (tags, indentation,
    one value), so even one at the 10 MiB size limit has ~250,000-350,000
    elements and passes, while a 10 MiB flood of ``<a/>`` (2.6 million
    elements, ~300 MB as a tree) is refused before any tree is built.
    """

    max_bytes: int = 10 * 1024 * 1024
    max_depth: int = LIBXML2_MAX_DEPTH
    max_elements: int = 500_000

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_elements"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"IntakeLimits.{name} must be a positive integer, not {value!r}")
        if self.max_depth > LIBXML2_MAX_DEPTH:
            raise ValueError(
                f"IntakeLimits.max_depth may not exceed {LIBXML2_MAX_DEPTH} (libxml2's limit without huge_tree)"
            )


DEFAULT_LIMITS = IntakeLimits()


# --------------------------------------------------------------------------- body


async def read_body(
    chunks: AsyncIterable[bytes],
    max_bytes: int,
    *,
    declared_length: int | None = None,
) -> bytes:
    """Read a streamed request body, refusing it once it passes *max_bytes*.

    Raises :class:`~gateway.errors.DocumentTooLargeError` as soon as the
    running size exceeds the limit: the chunk that crosses it is never kept,
    so at most ``max_bytes`` plus that one chunk is ever in memory. A
    *declared_length* (the ``Content-Length``) over the limit is refused before
    anything is read. On refusal the iterator is closed if it can be
    (``aclose``), so an ASGI body stream stops there.
    """
    if max_bytes < 0:
        raise ValueError("max_bytes must not be negative")
    if declared_length is not None and declared_length > max_bytes:
        raise DocumentTooLargeError(limit=max_bytes)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            size += len(chunk)
            if size > max_bytes:
                raise DocumentTooLargeError(limit=max_bytes)
            parts.append(bytes(chunk))
    except DocumentTooLargeError:
        parts.clear()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # pragma: no cover - closing is best effort
                pass
        raise
    return b"".join(parts)


# --------------------------------------------------------------------------- media type

_XML_SUBTYPE = re.compile(r"^application/[a-z0-9!#$&^_.+-]+\+xml$")


_MEDIA_TYPES: dict[str, str | None] = {}  # accepted Content-Type values seen -> their charset
_MEDIA_TYPES_MAX = 256


def check_media_type(content_type: str | None) -> str | None:
    """Check a ``Content-Type`` header value; return its charset, if any.

    Accepts ``application/xml``, ``text/xml`` and ``application/*+xml``
    (``application/ubl+xml``...), case-insensitively, with parameters. Returns
    the ``charset`` parameter as the canonical name of a supported encoding
    (``"UTF-8"``, ``"ISO-8859-1"``...) or ``None`` when there is none. Raises
    :class:`~gateway.errors.UnsupportedMediaTypeError`, naming what was
    received and what is accepted, for a missing or other media type or a
    charset that is not supported.
    """
    if content_type in _MEDIA_TYPES:  # the few values clients send, checked once each
        return _MEDIA_TYPES[content_type]
    charset = _check_media_type(content_type)
    if len(_MEDIA_TYPES) < _MEDIA_TYPES_MAX:
        _MEDIA_TYPES[content_type] = charset  # type: ignore[index]  # None never gets here: it raises
    return charset


def _check_media_type(content_type: str | None) -> str | None:
    accepted = ", ".join(ACCEPTED_MEDIA_TYPES)
    if content_type is None or not content_type.strip():
        raise UnsupportedMediaTypeError(
            f"The request has no Content-Type; send the document as one of: {accepted}.",
            received=None,
        )
    shown = clip(content_type.strip(), 100)
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type not in ("application/xml", "text/xml") and not _XML_SUBTYPE.match(media_type):
        raise UnsupportedMediaTypeError(
            f"Content-Type {shown!r} is not accepted; send the document as one of: {accepted} "
            "(a charset parameter is allowed).",
            received=content_type,
        )
    charset: str | None = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            value = value.strip().strip('"').strip()
            pyname = _lookup_encoding(value)
            if pyname is None:
                raise UnsupportedMediaTypeError(
                    f"Content-Type {shown!r} names charset {clip(value, 40)!r}, which this gateway does not "
                    f"decode; use UTF-8 (or {_SUPPORTED_TEXT}).",
                    received=content_type,
                )
            charset = SUPPORTED_ENCODINGS[pyname]
    return charset


# --------------------------------------------------------------------------- encodings

#: Python codec name -> the name libxml2 is given. UTF-32, the EBCDIC family,
#: the stateful ISO-2022 and the East Asian multi-byte sets are refused: no
#: partner needs them, and for the last two a byte scan for markup could be
#: wrong.
SUPPORTED_ENCODINGS: dict[str, str] = {
    "utf-8": "UTF-8",
    "utf-16": "UTF-16",
    "utf-16-le": "UTF-16LE",
    "utf-16-be": "UTF-16BE",
    "ascii": "US-ASCII",
    **{f"iso8859-{n}": f"ISO-8859-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 13, 14, 15, 16)},
    **{f"cp{n}": f"windows-{n}" for n in range(1250, 1259)},
}
_SUPPORTED_TEXT = "UTF-16, US-ASCII, ISO-8859-n, windows-125n"

_XML_DECL = re.compile(
    r"<\?xml[ \t\r\n]+version[ \t\r\n]*=[ \t\r\n]*(?:\"[^\"]*\"|'[^']*')"
    r"(?:[ \t\r\n]+encoding[ \t\r\n]*=[ \t\r\n]*(?:\"([^\"]*)\"|'([^']*)'))?"
)


def _lookup_encoding(label: str) -> str | None:
    """Python codec name of *label* if it is a supported encoding, else None."""
    try:
        name = codecs.lookup(label.strip()).name
    except (LookupError, ValueError, TypeError):
        return None
    return name if name in SUPPORTED_ENCODINGS else None


def _utf16(name: str | None) -> bool:
    return name is not None and name.startswith("utf-16")


def _agree(a: str, b: str) -> bool:
    """Whether two Python codec names name the same encoding for our purposes."""
    if a == b:
        return True
    return _utf16(a) and _utf16(b) and "utf-16" in (a, b)


def _not_well_formed(message: str, line: int | None = None, column: int | None = None) -> NotWellFormedError:
    return NotWellFormedError(message, [XMLErrorDetail(line, column, None, message)])


@dataclass(slots=True)
class _Decoded:
    text: str
    override: str | None  # the encoding to force on libxml2, None to let it detect
    utf8: bool  # the text was UTF-8 (with or without a byte order mark)


def _decode(data: bytes, declared_charset: str | None) -> _Decoded:
    # 1. Byte order mark, or the UTF-16 pattern of "<?" without one.
    bom: str | None = None
    bom_len = 0
    sniffed: str | None = None
    if data.startswith((b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00", b"\x00\x00\x00<", b"<\x00\x00\x00")):
        raise _not_well_formed(f"The document is UTF-32, which this gateway does not accept; use UTF-8 (or {_SUPPORTED_TEXT}).")
    if data.startswith(codecs.BOM_UTF8):
        bom, bom_len = "utf-8", 3
    elif data.startswith(codecs.BOM_UTF16_BE):
        bom, bom_len = "utf-16-be", 2
    elif data.startswith(codecs.BOM_UTF16_LE):
        bom, bom_len = "utf-16-le", 2
    elif data.startswith(b"\x00<\x00?"):
        sniffed = "utf-16-be"
    elif data.startswith(b"<\x00?\x00"):
        sniffed = "utf-16-le"
    family = bom or sniffed

    # 2. The XML declaration's encoding, read in the detected family.
    head_codec = family if family and family.startswith("utf-16") else "latin-1"
    head = data[bom_len : bom_len + 1024].decode(head_codec, errors="replace")
    decl_label: str | None = None
    match = _XML_DECL.match(head)
    if match:
        decl_label = match.group(1) if match.group(1) is not None else match.group(2)

    def lookup(label: str, where: str) -> str:
        name = _lookup_encoding(label)
        if name is None:
            known = True
            try:
                codecs.lookup(label.strip())
            except (LookupError, ValueError, TypeError):
                known = False
            what = "an encoding this gateway does not accept" if known else "not a known encoding"
            raise _not_well_formed(
                f"The {where} names {clip(label, 40)!r}, {what}; use UTF-8 (or {_SUPPORTED_TEXT})."
            )
        return name

    decl = lookup(decl_label, "XML declaration's encoding") if decl_label is not None else None
    http = lookup(declared_charset, "HTTP charset parameter") if declared_charset else None

    def label(name: str) -> str:
        return SUPPORTED_ENCODINGS[name]

    # 3. They must agree.
    if decl and http and not _agree(decl, http):
        raise _not_well_formed(
            f"Encodings conflict: the HTTP charset says {label(http)} but the XML declaration says "
            f"{label(decl)}; make them agree (or drop the charset parameter)."
        )
    if bom:
        for other, where in ((decl, "the XML declaration"), (http, "the HTTP charset")):
            if other and not _agree(bom, other):
                raise _not_well_formed(
                    f"Encodings conflict: the byte order mark says {label(bom)} but {where} says "
                    f"{label(other)}; make them agree."
                )
    elif sniffed:
        for other, where in ((decl, "the XML declaration"), (http, "the HTTP charset")):
            if other and not _agree(sniffed, other):
                raise _not_well_formed(
                    f"Encodings conflict: the document is laid out as {label(sniffed)} but {where} says "
                    f"{label(other)}; make them agree."
                )
    else:
        if _utf16(decl):
            raise _not_well_formed(
                f"The XML declaration says {label(decl)} but the document is not UTF-16 encoded "
                "(no byte order mark); re-encode it or correct the declaration."
            )
        if http == "utf-16" and decl is None:
            raise _not_well_formed(
                "The HTTP charset says UTF-16 but the document has no byte order mark; "
                "add one or say UTF-16LE / UTF-16BE."
            )
        if _utf16(http) and decl is not None:  # decl is not UTF-16 here, so they disagree
            raise _not_well_formed(
                f"Encodings conflict: the HTTP charset says {label(http)} but the XML declaration says "
                f"{label(decl)}; make them agree."
            )

    # 4. The encoding that applies, and whether libxml2 must be told it.
    if bom:
        effective, override, source = bom, None, "from its byte order mark"
    elif sniffed:
        effective, source = sniffed, "declared in its XML declaration"
        override = label(sniffed)
    else:
        if decl:
            effective, source = decl, "declared in its XML declaration"
        elif http:
            effective, source = http, "given by the HTTP charset"
        else:
            effective, source = "utf-8", "the default when no encoding is declared"
        override = None if effective == "utf-8" else label(effective)

    # 5. The bytes must decode in it.
    body = data[bom_len:] if bom_len else data
    try:
        text = body.decode(effective)
    except UnicodeDecodeError as exc:
        good = body[: exc.start].decode(effective, errors="replace")
        line = good.count("\n") + 1
        column = len(good) - (good.rfind("\n") + 1) + 1
        bad = body[exc.start : exc.start + 1].hex().upper()
        raise _not_well_formed(
            f"The bytes are not valid {label(effective)} ({source}): byte 0x{bad} at "
            f"line {line}, column {column} does not decode; re-encode the document or correct its encoding.",
            line,
            column,
        ) from None
    return _Decoded(text, override, effective == "utf-8")


# --------------------------------------------------------------------------- scanning

# Whitespace, comments and PIs (the XML declaration is one, lexically): all a
# prolog may hold before the root except a DOCTYPE. One C-level match.
_PROLOG = re.compile(r"(?:[ \t\r\n]+|<!--.*?-->|<\?.*?\?>)*", re.S)
# Element start tags, skipping the markup in which a "<" is not a tag. An
# unterminated comment, CDATA section or PI runs to the end of the text (one
# linear pass, never a rescan per "<!--"); libxml2 builds nothing after it.
_START_TAGS = re.compile(
    r"<!--.*?(?:-->|\Z)|<!\[CDATA\[.*?(?:\]\]>|\Z)|<\?.*?(?:\?>|\Z)|(<)(?![!?/])", re.S
)


def _position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def _security(message: str, line: int | None = None, column: int | None = None) -> XMLSecurityError:
    return XMLSecurityError(message, [XMLErrorDetail(line, column, None, message)])


_DOCTYPE_MESSAGE = (
    "The document has a DOCTYPE; DTDs, entity declarations and external references are not accepted. "
    "Send the document without a DOCTYPE."
)


def _check_prolog(text: str) -> None:
    end = _PROLOG.match(text).end()  # type: ignore[union-attr]  # always matches
    if text[end : end + 9].upper() == "<!DOCTYPE":
        line, column = _position(text, end)
        raise _security(_DOCTYPE_MESSAGE, line, column)


def _check_element_count(text: str, max_elements: int) -> None:
    if len(text) <= 4 * max_elements:  # "<a/>" is the smallest element
        return
    upper = text.count("<") - text.count("</") - text.count("<!") - text.count("<?")
    if upper <= max_elements:
        return
    count = 0
    for match in _START_TAGS.finditer(text):
        if match.group(1) is not None:
            count += 1
            if count > max_elements:
                line, column = _position(text, match.start())
                raise _security(
                    f"The document has more than {max_elements} elements, the most this gateway accepts; "
                    "split it into smaller documents.",
                    line,
                    column,
                )


# --------------------------------------------------------------------------- parsing

_local = threading.local()


class ExternalLoadRefused(Exception):
    """Raised by the intake parser's resolver for any external resource."""


class _RefuseExternal(etree.Resolver):
    """Refuses every external load (DTD subset, entity, anything): raising
    aborts the parse before libxml2's default loader could open a file."""

    def resolve(self, system_url: str, public_id: str, context: object) -> None:
        raise ExternalLoadRefused("external resources are never loaded")


def _parser(encoding: str | None) -> etree.XMLParser:
    """A hardened parser for this thread (lxml parsers must not be shared)."""
    parsers = getattr(_local, "parsers", None)
    if parsers is None:
        parsers = _local.parsers = {}
    parser = parsers.get(encoding)
    if parser is None:
        parser = etree.XMLParser(
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
        parsers[encoding] = parser
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
    _check_element_count(decoded.text, limits.max_elements)

    parser = _parser(decoded.override)
    try:
        root = etree.fromstring(data, parser)
    except etree.XMLSyntaxError:
        raise _syntax_error(parser.error_log, limits) from None
    except ExternalLoadRefused:  # unreachable unless the prolog scan was fooled
        raise _security(_DOCTYPE_MESSAGE) from None

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
    return root, (decoded.text if decoded.utf8 else None)
