"""Safe intake of XML request bodies: size, media type, encoding, parsing.

1. :func:`read_body`: the streamed body, refused (:class:`~gateway.errors.DocumentTooLargeError`) as soon as
   it passes ``max_bytes``.
2. :func:`check_media_type`: ``application/xml``, ``text/xml`` or ``application/*+xml``; returns the charset.
3. :func:`parse_document`: the bytes to an lxml tree, hardened.
   Encoding: the byte order mark, the XML declaration and the HTTP charset must agree, else
   :class:`~gateway.errors.NotWellFormedError`; the parser is told the encoding chosen, so that Python's
   check and libxml2 read the same text.
   No DTD: a DOCTYPE is refused before libxml2 sees the bytes, and the parser runs without entities, network
   or DTD loading, with a resolver that refuses every load. lxml's ``collect_ids=False`` is deliberately not
   used: with lxml 6.1 / libxml2 2.14 it makes libxml2 read external DTD subsets from local files despite
   ``load_dtd=False``.
   Limits (:class:`IntakeLimits`): the element count and the limits after the JDK's are checked on the text
   before any tree is built (:func:`_check_markup` jumps from "<" to "<" over stretches no over-long tag fits
   in); the depth beyond libxml2's own and what only the tree can tell are checked on it with XPath.
4. :func:`parse_and_validate` (the intake of larger bodies): the same, validating against the root element's
   schema while libxml2 parses, so that every error costs the same and their number is capped.

A pass over a long text goes a megabyte at a time and lxml parses without the interpreter lock, so no call
here holds the lock for long (see :mod:`gateway.exchange.stages`). What these functions put in an error is bounded
(:mod:`gateway.errors`) and never holds an entity expansion or the content of a file: none is ever loaded.
"""

from __future__ import annotations

import codecs
import re
import threading
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass, field
from typing import Any

from lxml import etree

from gateway.errors import (
    DocumentTooLargeError,
    IntakeLimitError,
    NameTooLongError,
    NotWellFormedError,
    TextTooLongError,
    TooManyAttributesError,
    TooManyDocumentNamespacesError,
    TooManyNamespacesError,
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
    "LIMIT_FIELDS",
    "SUPPORTED_ENCODINGS",
    "FEED_OVER_BYTES",
    "Validated",
    "check_media_type",
    "parse_and_validate",
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
    """Limits applied to one request body (docs/limits.md lists them for operators).

    ``max_bytes`` (10 MiB): the largest body. ``max_depth`` (256): the deepest nesting, at most libxml2's own
    limit without ``huge_tree``. ``max_elements`` (500,000): bounds the tree's memory (an lxml element costs
    about 120 bytes) while a real UBL document at the size limit still passes; a flood of ``<a/>`` is refused
    before any tree is built.

    The others follow the JDK's XML processing limits, so that what this gateway accepts a Java back end parses
    too: ``max_attributes`` (200, ``jdk.xml.elementAttributeLimit``, namespace declarations not counted);
    ``max_namespaces_per_element`` (100) and ``max_namespaces_per_document`` (100,000): each declaration costs
    libxml2 memory and widens the in-scope namespaces below it, yet generators copying the UBL examples declare
    one again in every invoice line; ``max_name_length`` (1,000, ``jdk.xml.maxXMLNameLimit``) for names and
    namespace URIs; ``max_text_length`` (4 MiB of characters) for one text or attribute value, room for an
    embedded attachment of about 3 MB. DTDs, and so entities, are refused outright.
    """

    max_bytes: int = 10 * 1024 * 1024
    max_depth: int = LIBXML2_MAX_DEPTH
    max_elements: int = 500_000
    max_attributes: int = 200
    max_namespaces_per_element: int = 100
    max_namespaces_per_document: int = 100_000
    max_name_length: int = 1_000
    max_text_length: int = 4 * 1024 * 1024
    #: the shortest stretch from a start tag's "<" to the next "<" that can hold a tag over a limit
    tag_gap: int = field(init=False, repr=False, compare=False, hash=False, default=0)

    def __post_init__(self) -> None:
        for name in LIMIT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"IntakeLimits.{name} must be a positive integer, not {value!r}")
        if self.max_depth > LIBXML2_MAX_DEPTH:
            raise ValueError(
                f"IntakeLimits.max_depth may not exceed {LIBXML2_MAX_DEPTH} (libxml2's limit without huge_tree)"
            )
        object.__setattr__(self, "tag_gap", min(
            self.max_name_length + 2,  # "<" and a longer name
            5 * self.max_attributes + 7,  # "<a" and one attribute more, ' b=""' each at least
            11 * self.max_namespaces_per_element + 11,  # ' xmlns=""' once, ' xmlns:p=""' for the others
            self.max_text_length + 1,  # "<" ... ">" and a longer text
        ))


#: The fields of :class:`IntakeLimits`, in order.
LIMIT_FIELDS = (
    "max_bytes", "max_depth", "max_elements", "max_attributes", "max_namespaces_per_element",
    "max_namespaces_per_document", "max_name_length", "max_text_length",
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
    found = bom or sniffed  # what the bytes themselves say
    if found:
        for other, where in ((decl, "the XML declaration"), (http, "the HTTP charset")):
            if other and not _agree(found, other):
                says = "the byte order mark says" if bom else "the document is laid out as"
                raise _not_well_formed(
                    f"Encodings conflict: {says} {label(found)} but {where} says {label(other)}; make them agree."
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
        text = _decode_slices(body, effective)
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


def _decode_slices(body: bytes, encoding: str) -> str:
    """``body.decode(encoding)``, a slice at a time for a long body (see _SLICE); the exact error of
    undecodable bytes comes from decoding the whole at once."""
    if len(body) <= _SLICE:
        return body.decode(encoding)
    decoder = codecs.getincrementaldecoder(encoding)()
    view = memoryview(body)
    try:
        parts = [decoder.decode(view[start:start + _SLICE]) for start in range(0, len(body), _SLICE)]
        parts.append(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        return body.decode(encoding)  # raises, with the offset in the whole body
    return "".join(parts)


def _check_prolog(text: str) -> None:
    end = _PROLOG.match(text).end()  # type: ignore[union-attr]  # always matches
    if text[end : end + 9].upper() == "<!DOCTYPE":
        line, column = _position(text, end)
        raise _security(_DOCTYPE_MESSAGE, line, column)


def _check_element_count(text: str, max_elements: int) -> None:
    if len(text) <= 4 * max_elements:  # "<a/>" is the smallest element
        return
    upper = _count(text, "<")  # each pass over a long text holds the interpreter lock: one settles most
    if upper <= max_elements:
        return
    upper -= _count(text, "</") + _count(text, "<!") + _count(text, "<?")
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


# The per-element limits (names, attributes, namespace declarations) and the text limit are checked on the
# text, before libxml2 builds anything, without looking at every tag: a start tag that passes one of them is
# long (a 1,001-character name, 201 attributes of at least 5 characters each...), so the distance from its "<"
# to the next "<" is at least limits.tag_gap. A scan that jumps from "<" to the last "<" within that distance
# (a backwards memchr: a few jumps for an ordinary document) finds every such gap, and only the tags at the start of
# one are read in full. The other limits of the list are checked the same way: an O(1) bound first, an exact
# count (on the tree, at C speed) only when the bound does not settle it.

_S = "[ \t\r\n]"  # XML's whitespace; not \s, which also ends a name at characters XML allows in names
_TAG_NAMES: dict[int, re.Pattern[str]] = {}


def _tag_name(longest: int) -> re.Pattern[str]:
    """A start tag's name, read no further than one character past *longest* (enough to refuse it)."""
    pattern = _TAG_NAMES.get(longest)
    if pattern is None:
        pattern = _TAG_NAMES[longest] = re.compile(r"<([^ \t\r\n/>]{1,%d})" % (longest + 1))
    return pattern


_TAG_NAME = re.compile(r"<([^ \t\r\n/>]+)")
_TAG_CLOSE = re.compile(rf"{_S}*/?>")
_START_TAG = re.compile(rf"""<[^ \t\r\n/>]+(?:{_S}+[^ \t\r\n=/>]+{_S}*={_S}*(?:"[^"]*"|'[^']*'))*{_S}*/?>""")
_ATTRIBUTE_NAMES = re.compile(rf"""{_S}+([^ \t\r\n=/>]+){_S}*={_S}*(?:"[^"]*"|'[^']*')""")
_ATTRIBUTE = re.compile(rf"""{_S}+([^ \t\r\n=/>]+){_S}*={_S}*(?:"([^"]*)"|'([^']*)')""")

_TREE_TEXT = 1  # a text node may pass max_text_length but the text alone cannot tell (CDATA, references)
_TREE_URIS = 2  # a namespace URI written with references may be longer than max_name_length


class _Opaque:
    """Whether a "<" lies inside a comment, CDATA section or processing instruction (where it is
    no markup), for positions asked in increasing order: each stretch of the text is searched once,
    and never further than the position asked (or, for the construct it lies in, that one's end)."""

    _KINDS = (("<!--", "-->"), ("<![CDATA[", "]]>"), ("<?", "?>"))

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0  # every construct that starts before this has been passed
        self.next: list[int | None] = [None, None, None]  # each kind's next opener found at or after pos
        self.seen = [0, 0, 0]  # how far each kind has been searched for
        self.span: tuple[int, int] | None = None  # the last construct found: [start, end)

    def inside(self, p: int) -> bool:
        """Whether the "<" at *p* lies inside a construct (one that starts at *p* does not count)."""
        text = self.text
        while True:
            if self.span is not None:
                start, end = self.span
                if p < end:
                    return start < p
                self.pos, self.span = end, None
            best: tuple[int, int] | None = None
            for i, (opener, _) in enumerate(self._KINDS):
                n = self.next[i]
                if n is not None and n < self.pos:  # it lay inside another construct: search on from pos
                    n = self.next[i] = None
                    self.seen[i] = max(self.seen[i], self.pos)
                if n is None and self.seen[i] < p:
                    found = _find(text, opener, max(self.pos, self.seen[i]), p)
                    self.seen[i] = p
                    if found >= 0:
                        n = self.next[i] = found
                if n is not None and n < p and (best is None or n < best[0]):
                    best = (n, i)
            if best is None:
                return False
            start, kind = best
            opener, closer = self._KINDS[kind]
            close = _find(text, closer, start + len(opener), len(text))
            self.span = (start, len(text) if close < 0 else close + len(closer))  # unterminated: to the end


def _over(cls: type[IntakeLimitError], what: str, key: str, value: int, advice: str, text: str,
          offset: int | None) -> IntakeLimitError:
    message = f"{what} (limits.{key} is {value}); {advice}"
    line = column = None
    if offset is not None:
        line, column = _position(text, offset)
    return cls(message, [XMLErrorDetail(line, column, None, message)], limit=key, limit_value=value)


def _name_too_long(kind: str, limits: IntakeLimits, text: str, offset: int | None) -> IntakeLimitError:
    n = limits.max_name_length
    return _over(NameTooLongError, f"The document has {kind} longer than {n} characters, the longest this gateway "
                 "accepts", "max_name_length", n, "use shorter names.", text, offset)


def _text_too_long(limits: IntakeLimits, text: str, offset: int | None) -> IntakeLimitError:
    n = limits.max_text_length
    return _over(TextTooLongError, f"The document has a text or attribute value longer than {n} characters, the "
                 "longest this gateway accepts", "max_text_length", n,
                 "send large content (an attachment) separately or split the document.", text, offset)


def _check_start_tag(text: str, p: int, nxt: int, limits: IntakeLimits) -> tuple[int, int]:
    """Check the start tag at *p* (the next "<" is at *nxt*) against the per-element limits; returns
    where the tag ends (*p* when it is not a well-formed tag: libxml2 will say why; *nxt* when the
    stretch is settled whole) and the tree checks it calls for.

    Bounds first, at C speed: no more "=" than attributes allowed and no "xmlns" settle both counts,
    and no longer run without whitespace settles every name ("\u1680", which str.split takes for
    whitespace, is a name character in XML). Only a tag they leave open is read attribute by attribute.
    """
    m = _tag_name(limits.max_name_length).match(text, p)
    if m is None:
        return p, 0
    if len(m.group(1)) > limits.max_name_length:
        raise _name_too_long("an element name", limits, text, p)
    equals = _count(text, "=", p, nxt)  # one per attribute or declaration, and any in values or the text after
    if equals <= limits.max_attributes and nxt - p <= _SLICE and text.find("xmlns", p, nxt) < 0:
        stretch = text[p:nxt]
        if "\u1680" not in stretch and max(map(len, stretch.split())) <= limits.max_name_length:
            return nxt, 0  # few enough attributes, no declaration, no long name: nothing to check after it
    if equals > limits.max_attributes + limits.max_namespaces_per_element or nxt - p > _SLICE:
        return _check_attributes_one_by_one(text, p, m.end(), limits)  # over a count, '=' in values, or long
    tag = _START_TAG.match(text, p)
    if tag is None:
        return p, 0
    names = _ATTRIBUTE_NAMES.findall(text, m.end(), tag.end())
    flags = 0
    if names:
        if max(map(len, names)) > limits.max_name_length:
            raise _name_too_long("an attribute name", limits, text, p)
        declarations = sum(1 for name in names if name == "xmlns" or name.startswith("xmlns:"))
        _check_counts(len(names) - declarations, declarations, limits, text, p)
        if declarations or tag.end() - m.end() > limits.max_text_length:
            for a in _ATTRIBUTE.finditer(text, m.end(), tag.end()):
                flags |= _check_value(a, limits, text, p)
    return tag.end(), flags


def _check_attributes_one_by_one(text: str, p: int, pos: int, limits: IntakeLimits) -> tuple[int, int]:
    """The attributes from *pos*, stopping at the first limit passed (a tag with thousands of them)."""
    attributes = declarations = flags = 0
    match = _ATTRIBUTE.match
    while (a := match(text, pos)) is not None:  # anchored: never a search through what follows the tag
        pos = a.end()
        name = a.group(1)
        if name == "xmlns" or name.startswith("xmlns:"):
            declarations += 1
        else:
            attributes += 1
        _check_counts(attributes, declarations, limits, text, p)
        if len(name) > limits.max_name_length:
            raise _name_too_long("an attribute name", limits, text, p)
        flags |= _check_value(a, limits, text, p)
    close = _TAG_CLOSE.match(text, pos)
    return (close.end() if close is not None else p), flags


def _check_counts(attributes: int, declarations: int, limits: IntakeLimits, text: str, p: int) -> None:
    if declarations > limits.max_namespaces_per_element:
        n = limits.max_namespaces_per_element
        raise _over(TooManyNamespacesError, f"The document has an element that declares more than {n} namespaces, "
                    "the most this gateway accepts", "max_namespaces_per_element", n,
                    "declare each namespace once, on the root element.", text, p)
    if attributes > limits.max_attributes:
        n = limits.max_attributes
        raise _over(TooManyAttributesError, f"The document has an element with more than {n} attributes, the most "
                    "this gateway accepts", "max_attributes", n,
                    "carry the data in child elements or split the document.", text, p)


def _check_value(a: re.Match[str], limits: IntakeLimits, text: str, p: int) -> int:
    """Check one attribute's value: a namespace URI against max_name_length, any other value against
    max_text_length; returns the tree checks needed when references make it shorter than written."""
    name = a.group(1)
    value = a.group(2) if a.group(2) is not None else a.group(3)
    if name == "xmlns" or name.startswith("xmlns:"):
        if len(value) > limits.max_name_length:
            if "&" in value:
                return _TREE_URIS
            raise _name_too_long("a namespace URI", limits, text, p)
    elif len(value) > limits.max_text_length:
        if "&" in value:
            return _TREE_TEXT
        raise _text_too_long(limits, text, p)
    return 0


def _check_markup(text: str, limits: IntakeLimits) -> int:
    """The checks of the per-element, name and text limits that the text settles (raising the
    IntakeLimitError of the first limit passed), and the flags of those only the tree can settle."""
    n = len(text)
    flags = 0
    gap = limits.tag_gap
    pos = text.find("<")
    if pos < 0:
        return flags
    rfind = text.rfind
    opaque: _Opaque | None = None
    while pos + gap <= n:
        last = rfind("<", pos + 1, pos + gap)
        if last >= 0:
            pos = last
            continue
        nxt = text.find("<", pos + gap)  # the gap from pos to nxt is at least `gap` long: read its tag
        if nxt < 0:
            nxt = n
        if opaque is None:
            opaque = _Opaque(text)
        if not opaque.inside(pos):
            if text.startswith("</", pos):
                end = text.find(">", pos) + 1 or pos
            elif text.startswith(("<!", "<?"), pos):
                end = _construct_end(text, pos, nxt)  # no tag; what follows its end, up to nxt, is character data
            else:
                end, more = _check_start_tag(text, pos, nxt, limits)
                flags |= more
        else:  # a "<" inside a construct: what follows the construct's end, up to nxt, is character data
            assert opaque.span is not None
            end = opaque.span[1] if opaque.span[1] <= nxt else pos
        if end > pos and nxt < n and nxt - end > limits.max_text_length:  # character data up to nxt
            if _find(text, "&", end, nxt) < 0:
                raise _text_too_long(limits, text, end)
            flags |= _TREE_TEXT  # references make it shorter than written
        if nxt >= n:
            break
        pos = nxt
    if n > limits.max_text_length and _find(text, "<![CDATA[") >= 0:
        flags |= _TREE_TEXT  # text and CDATA sections make one text node: only the tree has its length
    if n > 9 * limits.max_namespaces_per_document and _count(text, "xmlns") > limits.max_namespaces_per_document:
        _count_declarations(text, limits)  # a declaration is at least 9 characters (' xmlns=""')
    return flags


def _construct_end(text: str, p: int, nxt: int) -> int:
    """Where the comment, CDATA section or PI at *p* ends, if before *nxt*; else *p*. Its own text is the
    tree's to count (a CDATA section's joins the text around it: see _check_markup's last checks)."""
    for opener, closer in _Opaque._KINDS:
        if text.startswith(opener, p):
            close = _find(text, closer, p + len(opener), nxt)
            return close + len(closer) if close >= 0 else p
    return p


# Start tags and the constructs whose "<" is no markup, for counting namespace declarations.
_TAGS_FOR_DECLARATIONS = re.compile(
    rf"""<!--.*?(?:-->|\Z)|<!\[CDATA\[.*?(?:\]\]>|\Z)|<\?.*?(?:\?>|\Z)"""
    rf"""|<[^!?/ \t\r\n>][^ \t\r\n/>]*((?:{_S}+[^ \t\r\n=/>]+{_S}*={_S}*(?:"[^"]*"|'[^']*'))*)""",
    re.S,
)


def _declarations(text: str) -> int:
    """The namespace declarations in the start tags of *text*, counted by the regular expression engine
    alone (findall and join): a Python step per tag would cost about twice the engine's own time, all of
    it holding the interpreter lock."""
    names = _ATTRIBUTE_NAMES.findall("".join(_TAGS_FOR_DECLARATIONS.findall(text)))
    spaced = f" {'  '.join(names)} "  # names hold no space
    return spaced.count(" xmlns ") + spaced.count(" xmlns:")


def _count_declarations(text: str, limits: IntakeLimits) -> None:
    """Count the namespace declarations of every start tag (when the word "xmlns" alone could pass the
    limit), refusing the document once they do: before libxml2 builds the tree. The text goes a piece at a
    time, each cut before a "<" that opens markup: the engine holds the interpreter lock for a whole call
    and reads markup several times slower than a str method, so a piece is a quarter of a slice."""
    n = limits.max_namespaces_per_document
    count = 0
    opaque = _Opaque(text)
    start, end = 0, len(text)
    while start < end:
        cut = text.find("<", start + max(1, _SLICE // 4))
        while cut >= 0 and opaque.inside(cut):
            assert opaque.span is not None
            cut = text.find("<", opaque.span[1])
        cut = end if cut < 0 else cut
        piece = text[start:cut]
        more = _declarations(piece)
        if count + more > n:
            for m in _TAGS_FOR_DECLARATIONS.finditer(piece):  # where, within this piece, the limit is passed
                block = m.group(1)
                if block and "xmlns" in block:
                    count += _declarations(m.group(0))
                    if count > n:
                        raise _over(TooManyDocumentNamespacesError, f"The document declares more than {n} namespaces "
                                    "in all, the most this gateway accepts", "max_namespaces_per_document", n,
                                    "declare each namespace once, on the root element, rather than on every "
                                    "element.", text, start + m.start())
        count += more
        start = cut


#: Passes over a long text go a slice at a time: a str method holds the interpreter lock for its whole call,
#: and the store's writer thread, its heartbeats and the event loop must never wait for long.
_SLICE = 1 << 16


def _count(text: str, sub: str, lo: int = 0, hi: int | None = None) -> int:
    """``text.count(sub, lo, hi)``, a slice at a time."""
    hi = len(text) if hi is None else min(hi, len(text))
    if hi - lo <= _SLICE:
        return text.count(sub, lo, hi)
    overlap = len(sub) - 1  # an occurrence across a boundary is counted in the slice it starts in
    return sum(text.count(sub, start, min(hi, start + _SLICE + overlap)) for start in range(lo, hi, _SLICE))


def _find(text: str, sub: str, lo: int = 0, hi: int | None = None) -> int:
    """``text.find(sub, lo, hi)``, a slice at a time."""
    hi = len(text) if hi is None else min(hi, len(text))
    overlap = len(sub) - 1
    for start in range(lo, hi, _SLICE):
        found = text.find(sub, start, min(hi, start + _SLICE + overlap))
        if found >= 0:
            return found
    return -1


_XPATH_LONG_TEXT = etree.XPath("(//text() | //@*)[string-length(.) > $n][1]")
_XPATH_LONG_URI = etree.XPath("(//namespace::*)[name() != 'xml' and string-length(.) > $n][1]")


def _check_tree(root: etree._Element, text: str, limits: IntakeLimits, flags: int) -> None:
    """The exact checks the text could not settle (rare: see :func:`_check_markup`), at C speed."""
    if flags & _TREE_TEXT:
        hit = _XPATH_LONG_TEXT(root, n=limits.max_text_length)
        if hit:
            parent = getattr(hit[0], "getparent", lambda: None)()
            err = _text_too_long(limits, text, None)
            line = parent.sourceline if parent is not None else None
            raise type(err)(err.detail, [XMLErrorDetail(line, None, None, err.detail)], limit=err.limit,
                            limit_value=err.limit_value)
    if flags & _TREE_URIS and _XPATH_LONG_URI(root, n=limits.max_name_length):
        raise _name_too_long("a namespace URI", limits, text, None)


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


# --------------------------------------------------------------------------- validating while parsing

#: Bodies larger than this are validated while being fed to the parser a chunk at a time, so that
#: the validation can stop once ``max_errors`` errors are in; smaller ones in one call (a push
#: parse costs about half as much again as a parse from memory).
FEED_OVER_BYTES = 1024 * 1024
_FEED_CHUNK = 256 * 1024


@dataclass(slots=True)
class Validated:
    """What :func:`parse_and_validate` made of a body.

    ``root`` is the tree (None when the document is invalid: the validating parse keeps none);
    ``schema`` what :func:`parse_and_validate`'s *schema_for* chose (None: not validated);
    ``errors`` libxml2's validation errors (empty when valid), at most ``max_errors`` of them,
    ``complete`` False when the validation stopped there.
    """

    root: etree._Element | None
    text: str | None
    schema: Any = None
    errors: list[Any] = field(default_factory=list)
    complete: bool = True


def parse_and_validate(
    data: bytes,
    schema_for: Callable[[str], tuple[Any, etree.XMLSchema] | None],
    limits: IntakeLimits = DEFAULT_LIMITS,
    *,
    declared_charset: str | None = None,
    max_errors: int = 1000,
) -> Validated:
    """:func:`parse_document_text` and XSD validation in one pass (libxml2's streaming validator).

    *schema_for* gets the root element's Clark name, read from the root's start tag, and returns a
    key and the schema to validate against, or None to parse without validating. Each error costs
    the same whatever the document's shape (a validation of the tree walks the preceding siblings
    of every element in error), and at most about *max_errors* are collected: bodies over
    :data:`FEED_OVER_BYTES` are fed a chunk at a time and the validation stops once that many are in.
    Raises what :func:`parse_document` raises for a document that is not well-formed or over a limit.
    """
    decoded, tree_checks = _prepare(data, limits, declared_charset)
    root_name = _root_name(decoded.text)
    chosen = schema_for(root_name) if root_name is not None else None
    if chosen is None:
        root, _ = parse_document_text(data, limits, declared_charset=declared_charset)
        return Validated(root, decoded.text if decoded.utf8 else None)
    key, schema = chosen
    parser = _parser(decoded.override, schema)
    text = decoded.text if decoded.utf8 else None

    def redo() -> object:
        return parse_document_text(data, limits, declared_charset=declared_charset)
    try:
        if len(data) <= FEED_OVER_BYTES:
            try:
                root = etree.fromstring(data, parser)
            except etree.XMLSyntaxError:
                log = list(parser.error_log)
                return _invalid_or_raise(log, key, text, redo, complete=True)
        else:
            stopped = False
            try:
                for start in range(0, len(data), _FEED_CHUNK):
                    parser.feed(data[start:start + _FEED_CHUNK])
                    if len(parser.feed_error_log) >= max_errors:
                        stopped = True
                        break
                log = list(parser.feed_error_log)
            except etree.XMLSyntaxError:
                log = list(parser.feed_error_log)
                _close_quietly(parser)
                return _invalid_or_raise(log, key, text, redo, complete=True)
            if stopped:
                _close_quietly(parser)
                return _invalid_or_raise(log, key, text, redo, complete=False)
            try:
                root = parser.close()
            except etree.XMLSyntaxError:
                return _invalid_or_raise(list(parser.feed_error_log), key, text, redo, complete=True)
    except ExternalLoadRefusedError:  # unreachable unless the prolog scan was fooled
        raise _security(_DOCTYPE_MESSAGE) from None
    _finish(root, decoded, limits, tree_checks)
    return Validated(root, text, key)


def _close_quietly(parser: etree.XMLParser) -> None:
    try:
        parser.close()  # ends the unfinished document, so the parser starts afresh next time
    except etree.XMLSyntaxError:
        pass


def _invalid_or_raise(log: list[Any], key: Any, text: str | None, redo: Callable[[], object], *,
                      complete: bool) -> Validated:
    """A document the validating parse refused: invalid (returns its validation errors, at most the
    first max_errors) or not well-formed, when *redo* (the plain parse, which libxml2's well-formedness
    errors come from intact) raises what :func:`parse_document` raises."""
    schema_errors = [e for e in log if e.domain == _SCHEMA_DOMAIN]
    if not schema_errors or (complete and any(e.domain != _SCHEMA_DOMAIN and e.level >= etree.ErrorLevels.ERROR
                                              for e in log)):
        redo()
    if not schema_errors:  # pragma: no cover - the plain parse raised
        raise _not_well_formed("The document is not well-formed XML.")
    return Validated(None, text, key, schema_errors, complete)


_SCHEMA_DOMAIN = etree.ErrorDomains.SCHEMASV


def _root_name(text: str) -> str | None:
    """The Clark name of the root element as its start tag writes it (None when it cannot tell: a
    reference in a namespace URI, a prefix declared nowhere on the root)."""
    start = _PROLOG.match(text).end()  # type: ignore[union-attr]  # always matches
    m = _TAG_NAME.match(text, start)
    if m is None:
        return None
    qname = m.group(1)
    prefix, _, local = qname.rpartition(":")
    wanted = f"xmlns:{prefix}" if prefix else "xmlns"
    pos = m.end()
    while (a := _ATTRIBUTE.match(text, pos)) is not None:
        pos = a.end()
        if a.group(1) == wanted:
            uri = a.group(2) if a.group(2) is not None else a.group(3)
            if "&" in uri:
                return None
            return f"{{{uri}}}{local}" if uri else local
    return None if prefix else local
