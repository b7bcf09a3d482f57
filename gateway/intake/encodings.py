"""A body's encoding, from its byte order mark, its XML declaration and the HTTP charset, which must agree,
so that Python's check and libxml2 read the same text."""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from gateway.errors import (
    NotWellFormedError,
    XMLErrorDetail,
    clip,
)
from gateway.intake.scan import _decode_slices

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
        raise _not_well_formed(
            f"The document is UTF-32, which this gateway does not accept; use UTF-8 (or {_SUPPORTED_TEXT})."
        )
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
            raise _not_well_formed(f"The {where} names {clip(label, 40)!r}, {what}; use UTF-8 (or {_SUPPORTED_TEXT}).")
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
