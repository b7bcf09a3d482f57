"""The markup scan before libxml2 sees a document: no DOCTYPE, and every name, text, attribute count and
namespace declaration within the limits, found in linear time with regular expressions over the text."""

from __future__ import annotations

import codecs
import re

from lxml import etree

from gateway.errors import (
    IntakeLimitError,
    NameTooLongError,
    TextTooLongError,
    TooManyAttributesError,
    TooManyDocumentNamespacesError,
    TooManyNamespacesError,
    XMLErrorDetail,
    XMLSecurityError,
)
from gateway.intake.limits import IntakeLimits

# --------------------------------------------------------------------------- scanning

# Whitespace, comments and PIs (the XML declaration is one, lexically): all a
# prolog may hold before the root except a DOCTYPE. One C-level match.
_PROLOG = re.compile(r"(?:[ \t\r\n]+|<!--.*?-->|<\?.*?\?>)*", re.S)
# Element start tags, skipping the markup in which a "<" is not a tag. An
# unterminated comment, CDATA section or PI runs to the end of the text (one
# linear pass, never a rescan per "<!--"); libxml2 builds nothing after it.
_START_TAGS = re.compile(r"<!--.*?(?:-->|\Z)|<!\[CDATA\[.*?(?:\]\]>|\Z)|<\?.*?(?:\?>|\Z)|(<)(?![!?/])", re.S)


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
        parts = [decoder.decode(view[start : start + _SLICE]) for start in range(0, len(body), _SLICE)]
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
        pattern = _TAG_NAMES[longest] = re.compile(rf"<([^ \t\r\n/>]{{1,{longest + 1}}})")
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


def _over(
    cls: type[IntakeLimitError], what: str, key: str, value: int, advice: str, text: str, offset: int | None
) -> IntakeLimitError:
    message = f"{what} (limits.{key} is {value}); {advice}"
    line = column = None
    if offset is not None:
        line, column = _position(text, offset)
    return cls(message, [XMLErrorDetail(line, column, None, message)], limit=key, limit_value=value)


def _name_too_long(kind: str, limits: IntakeLimits, text: str, offset: int | None) -> IntakeLimitError:
    n = limits.max_name_length
    return _over(
        NameTooLongError,
        f"The document has {kind} longer than {n} characters, the longest this gateway accepts",
        "max_name_length",
        n,
        "use shorter names.",
        text,
        offset,
    )


def _text_too_long(limits: IntakeLimits, text: str, offset: int | None) -> IntakeLimitError:
    n = limits.max_text_length
    return _over(
        TextTooLongError,
        f"The document has a text or attribute value longer than {n} characters, the longest this gateway accepts",
        "max_text_length",
        n,
        "send large content (an attachment) separately or split the document.",
        text,
        offset,
    )


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
        raise _over(
            TooManyNamespacesError,
            f"The document has an element that declares more than {n} namespaces, the most this gateway accepts",
            "max_namespaces_per_element",
            n,
            "declare each namespace once, on the root element.",
            text,
            p,
        )
    if attributes > limits.max_attributes:
        n = limits.max_attributes
        raise _over(
            TooManyAttributesError,
            f"The document has an element with more than {n} attributes, the most this gateway accepts",
            "max_attributes",
            n,
            "carry the data in child elements or split the document.",
            text,
            p,
        )


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
                        raise _over(
                            TooManyDocumentNamespacesError,
                            f"The document declares more than {n} namespaces in all, the most this gateway accepts",
                            "max_namespaces_per_document",
                            n,
                            "declare each namespace once, on the root element, rather than on every element.",
                            text,
                            start + m.start(),
                        )
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
            raise type(err)(
                err.detail, [XMLErrorDetail(line, None, None, err.detail)], limit=err.limit, limit_value=err.limit_value
            )
    if flags & _TREE_URIS and _XPATH_LONG_URI(root, n=limits.max_name_length):
        raise _name_too_long("a namespace URI", limits, text, None)
