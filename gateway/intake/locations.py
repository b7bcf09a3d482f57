"""Where an element stands in the document as received: its line and column, and a path a partner can read."""

from __future__ import annotations

import codecs
import re
from collections.abc import Mapping

from lxml import etree

# --------------------------------------------------------------------------- element locations


def element_path(element: etree._Element) -> str:
    """XPath-like location of *element* with the document's own prefixes.

    A step gets a 1-based position when its parent has more than one child of
    that name: ``/Order/cac:OrderLine[2]/cbc:Quantity``. An element in the
    default namespace is written with its local name only.
    """
    steps: list[str] = []
    el: etree._Element | None = element
    while el is not None:
        qname = etree.QName(el)
        name = f"{el.prefix}:{qname.localname}" if el.prefix else qname.localname
        parent = el.getparent()
        if parent is not None:
            before = sum(1 for _ in el.itersiblings(el.tag, preceding=True))
            after = next(el.itersiblings(el.tag), None) is not None
            if before or after:
                name = f"{name}[{before + 1}]"
        steps.append(name)
        el = parent
    return "/" + "/".join(reversed(steps))


# Start tags with their extent; the alternatives skip markup in which "<" is not a tag.
_START_TAGS = re.compile(
    r"<!--.*?(?:-->|\Z)|<!\[CDATA\[.*?(?:\]\]>|\Z)|<\?.*?(?:\?>|\Z)|(<(?![!?/])(?:[^>\"']|\"[^\"]*\"|'[^']*')*>)",
    re.S,
)


def _decode_source(root: etree._Element, source: bytes) -> str | None:
    encoding = root.getroottree().docinfo.encoding or "UTF-8"
    if source.startswith(codecs.BOM_UTF8):
        encoding = "utf-8-sig"
    try:
        return source.decode(encoding)
    except (LookupError, UnicodeDecodeError):
        return None


def _locate(root: etree._Element, text: str, wanted: set[etree._Element]) -> dict[etree._Element, tuple[int, int]]:
    """Line and column of the ``<`` of each wanted element's start tag.

    Pairs the elements in document order with the start tags of the text in
    order (exact for a parsed document without a DTD); a pair whose line does
    not agree with lxml's ``sourceline`` (the line where the tag ends) is
    left out rather than reported wrong.
    """
    found: dict[etree._Element, tuple[int, int]] = {}
    tags = (m for m in _START_TAGS.finditer(text) if m.group(1) is not None)
    line, offset = 1, 0
    remaining = len(wanted)
    for el in root.iter(etree.Element):
        m = next(tags, None)
        if m is None:
            break
        if el not in wanted:
            continue
        start = m.start()
        line += text.count("\n", offset, start)
        offset = start
        end_line = line + text.count("\n", start, m.end())
        if el.sourceline is None or line <= el.sourceline <= end_line:
            column = start - (text.rfind("\n", 0, start) + 1) + 1
            found[el] = (line, column)
        remaining -= 1
        if not remaining:
            break
    return found


_CLARK = re.compile(r"\{([^}]*)\}([A-Za-z_][\w.\-]*)")


def _prefixed(message: str, nsmap: Mapping[str | None, str]) -> str:
    """Rewrite ``{ns}local`` in a libxml2 message with the document's prefixes."""
    reverse = {uri: prefix for prefix, uri in nsmap.items()}

    def repl(m: re.Match[str]) -> str:
        if m.group(1) in reverse:
            prefix = reverse[m.group(1)]
            return f"{prefix}:{m.group(2)}" if prefix else m.group(2)
        return m.group(0)

    return _CLARK.sub(repl, message)
