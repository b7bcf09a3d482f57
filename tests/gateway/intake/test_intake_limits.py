"""The intake limits that follow the JDK's XML processing limits (gateway.intake.xmlsafe.IntakeLimits):
attributes per element, namespace declarations per element and per document, name length, text size.

A document is accepted exactly when it is within every limit, and refused otherwise with the code of
a limit it passes; the refusal names the limit and its configured value and quotes nothing of the
document. The generated documents come with what they hold (counted as they are written, the way the
JDK counts: namespace declarations are not attributes, names include their prefix), and are spiced with
what must not be mistaken for markup: fake tags in comments, CDATA sections and attribute values, ">"
and "=" in values, references, text split by CDATA sections.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lxml import etree

from gateway.errors import (
    IntakeLimitError,
    NameTooLongError,
    TextTooLongError,
    TooManyAttributesError,
    TooManyDocumentNamespacesError,
    XMLSecurityError,
)
from gateway.intake.xmlsafe import DEFAULT_LIMITS, IntakeLimits, parse_document

CODES = {
    "max_attributes": "too-many-attributes",
    "max_namespaces_per_element": "too-many-namespaces",
    "max_namespaces_per_document": "too-many-document-namespaces",
    "max_name_length": "name-too-long",
    "max_text_length": "text-too-long",
}
MARK = "Zq"  # every generated name, value and text is made of these letters: the refusal must quote none


# --------------------------------------------------------------------------- documents that know what they hold


@dataclass
class Held:
    """The largest of each measure over a document."""

    attributes: int = 0
    namespaces: int = 0
    document_namespaces: int = 0
    name: int = 0
    text: int = 0

    def over(self, limits: IntakeLimits) -> set[str]:
        over = set()
        if self.attributes > limits.max_attributes:
            over.add("max_attributes")
        if self.namespaces > limits.max_namespaces_per_element:
            over.add("max_namespaces_per_element")
        if self.document_namespaces > limits.max_namespaces_per_document:
            over.add("max_namespaces_per_document")
        if self.name > limits.max_name_length:
            over.add("max_name_length")
        if self.text > limits.max_text_length:
            over.add("max_text_length")
        return over


@dataclass
class Element:
    local: str
    prefix: str | None
    attributes: list[tuple[str, str, str]]  # name, value as written, quote
    declarations: list[tuple[str | None, str]]  # prefix (None: default), URI
    content: list[object] = field(
        default_factory=list
    )  # Element, ("text", written, length), ("cdata", s), ("comment", s)


def name_of(length: int) -> str:
    """A name of exactly *length* characters (length >= 1)."""
    body = (MARK * length)[: length - 1]
    return "n" + body


# written form, decoded length: references are shorter than written
_TEXT_PIECES = [("Zq", 2), ("&amp;", 1), ("&#90;", 1), (">", 1), ("=", 1), ('"', 1), ("'", 1), (" ", 1)]
# markup-like noise inside comments, CDATA sections and values: never counted as markup
_FAKE_TAG = '<fake a="1" b="2" c="3" d="4" e="5" f="6" xmlns:p="q" xmlns:r="s" NNNNNNNNNNNNNNNNNNNNNNNN="x">'


@st.composite
def text_runs(draw, max_length: int) -> tuple[str, int]:
    pieces = draw(st.lists(st.sampled_from(_TEXT_PIECES), max_size=6))
    filler = draw(st.integers(0, max_length))
    written = "Z" * filler + "".join(p for p, _ in pieces)
    return written.replace("<", "&lt;"), filler + sum(n for _, n in pieces)


@st.composite
def elements(draw, depth: int, scale: int) -> Element:
    local = name_of(draw(st.integers(1, scale)))
    n_decl = draw(st.integers(0, scale // 2))
    declarations: list[tuple[str | None, str]] = []
    if draw(st.booleans()):
        declarations.append((None, "urn:" + "Zq" * draw(st.integers(0, scale))))
    for i in range(n_decl):
        declarations.append(
            (f"p{i}" + "q" * draw(st.integers(0, scale // 4)), "urn:Z" + "q" * draw(st.integers(0, scale)))
        )
    prefixed = [p for p, _ in declarations if p is not None]
    prefix = draw(st.sampled_from(prefixed)) if prefixed and draw(st.booleans()) else None
    attributes = []
    for i in range(draw(st.integers(0, scale))):
        value, _ = draw(text_runs(scale))
        if draw(st.booleans()):
            value += _FAKE_TAG.replace("<", "&lt;").replace('"', "&quot;")
        attributes.append((f"a{i}" + "Z" * draw(st.integers(0, scale // 4)), value, draw(st.sampled_from(['"', "'"]))))
    element = Element(local, prefix, attributes, declarations)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(
            st.sampled_from(["text", "text", "cdata", "comment", "element"] if depth else ["text", "cdata", "comment"])
        )
        if kind == "element":
            element.content.append(draw(elements(depth - 1, scale)))
        elif kind == "text":
            written, length = draw(text_runs(scale * 3))
            element.content.append(("text", written, length))
        elif kind == "cdata":
            element.content.append(("cdata", "Zq" * draw(st.integers(0, scale)) + _FAKE_TAG))
        else:
            element.content.append(("comment", _FAKE_TAG + "Zq" * draw(st.integers(0, scale))))
    return element


def write(element: Element, held: Held, whitespace: str = " ") -> str:
    qname = f"{element.prefix}:{element.local}" if element.prefix else element.local
    held.name = max(held.name, len(qname))
    parts = [f"<{qname}"]
    for prefix, uri in element.declarations:
        name = f"xmlns:{prefix}" if prefix else "xmlns"
        parts.append(f'{whitespace}{name}="{uri}"')
        held.name = max(held.name, len(name), len(uri))
    held.namespaces = max(held.namespaces, len(element.declarations))
    held.document_namespaces += len(element.declarations)
    for name, value, quote in element.attributes:
        written = value.replace(quote, "&quot;" if quote == '"' else "&apos;")
        parts.append(f"{whitespace}{name}={quote}{written}{quote}")
        held.name = max(held.name, len(name))
        held.text = max(held.text, len(etree.fromstring(f"<x a={quote}{written}{quote}/>").get("a")))
    held.attributes = max(held.attributes, len(element.attributes))
    if not element.content:
        return "".join(parts) + "/>"
    parts.append(">")
    run = 0  # the text node being built: text and CDATA sections join, a comment or element ends it
    for item in element.content:
        if isinstance(item, Element):
            held.text, run = max(held.text, run), 0
            parts.append(write(item, held, whitespace))
        elif item[0] == "text":
            parts.append(item[1])
            run += item[2]
        elif item[0] == "cdata":
            parts.append(f"<![CDATA[{item[1]}]]>")
            run += len(item[1])
        else:
            held.text, run = max(held.text, run), 0
            parts.append(f"<!--{item[1]}-->")
    held.text = max(held.text, run)
    parts.append(f"</{qname}>")
    return "".join(parts)


def check(data: bytes, held: Held, limits: IntakeLimits) -> None:
    over = held.over(limits)
    try:
        parse_document(data, limits)
    except IntakeLimitError as exc:
        assert exc.limit in over, (exc.limit, over, held)
        assert exc.code == CODES[exc.limit]
        assert exc.limit_value == getattr(limits, exc.limit)
        assert f"limits.{exc.limit} is {exc.limit_value}" in exc.detail
        body = json.dumps(exc.to_dict())
        assert MARK not in body and "NNNN" not in body  # nothing of the document is quoted
        assert exc.to_dict()["limit"] == exc.limit
    else:
        assert not over, (over, held)


# --------------------------------------------------------------------------- properties


def limits_around(held: Held, draw_delta) -> IntakeLimits:
    """Limits at, just under or just over what the document holds."""
    return dataclasses.replace(
        DEFAULT_LIMITS,
        max_attributes=max(1, held.attributes + draw_delta()),
        max_namespaces_per_element=max(1, held.namespaces + draw_delta()),
        max_namespaces_per_document=max(1, held.document_namespaces + draw_delta()),
        max_name_length=max(1, held.name + draw_delta()),
        max_text_length=max(1, held.text + draw_delta()),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(elements(depth=2, scale=12), st.data(), st.sampled_from([" ", "\n", "\t ", "\r\n  "]))
def test_documents_within_every_limit_pass_and_just_over_one_are_refused(root: Element, data, whitespace: str) -> None:
    held = Held()
    text = write(root, held, whitespace)
    assume(held.document_namespaces <= 200)
    limits = limits_around(held, lambda: data.draw(st.sampled_from([-1, 0, 0, 1])))
    check(text.encode(), held, limits)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(elements(depth=2, scale=60), st.data())
def test_long_documents_with_long_tags_and_texts(root: Element, data) -> None:
    """Tags and texts long enough for the text scan's jumps to land inside them."""
    held = Held()
    text = write(root, held)
    limits = limits_around(held, lambda: data.draw(st.sampled_from([-1, 0, 1])))
    check(text.encode(), held, limits)
    check(text.encode("utf-16"), held, limits)  # the same on any encoding


@pytest.mark.parametrize("key", list(CODES))
def test_each_limit_at_the_default_value(key: str) -> None:
    value = getattr(DEFAULT_LIMITS, key)
    ok, over = _document_for(key, value), _document_for(key, value + 1)
    parse_document(ok)
    with pytest.raises(IntakeLimitError) as info:
        parse_document(over)
    assert info.value.code == CODES[key] and info.value.limit == key
    assert f"limits.{key} is {value}" in info.value.detail
    assert info.value.errors and info.value.errors[0].message == info.value.detail


def _document_for(key: str, n: int) -> bytes:
    ns = 'xmlns="urn:r"'
    if key == "max_attributes":
        attrs = " ".join(f'a{i}="v"' for i in range(n))
        return f"<r {ns}><e {attrs}/></r>".encode()
    if key == "max_namespaces_per_element":
        decls = " ".join(f'xmlns:p{i}="urn:{i}"' for i in range(n - 1))
        return f"<r {ns} {decls}/>".encode()
    if key == "max_namespaces_per_document":
        return (f"<r {ns}>" + "".join(f'<e xmlns:p="urn:{i}"/>' for i in range(n - 1)) + "</r>").encode()
    if key == "max_name_length":
        return f"<r {ns}><{'e' * n}/></r>".encode()
    return f"<r {ns}><e>{'x' * n}</e></r>".encode()


# --------------------------------------------------------------------------- the cases the text scan must not miss


def test_names_of_every_kind() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_name_length=20)
    ok = "n" * 20
    parse_document(f'<{ok} {ok}="1" xmlns:{"p" * 14}="{"u" * 20}"/>'.encode(), limits)
    for doc in (
        f"<{'e' * 21}/>",
        f'<r {"a" * 21}="1"/>',
        f'<p:{"e" * 19} xmlns:p="u"/>',
        f'<r xmlns:{"p" * 15}="u"/>',
        f'<r xmlns="{"u" * 21}"/>',
        f'<r xmlns:p="{"u" * 21}"/>',
        f'<r xmlns:p="{"u" * 17}&amp;&amp;&amp;&amp;"/>',
    ):
        with pytest.raises(NameTooLongError):
            parse_document(doc.encode(), limits)
    parse_document(f'<r xmlns:p="{"u" * 16}&amp;&amp;&amp;&amp;"/>'.encode(), limits)  # 20 characters, 32 written


def test_a_greater_than_sign_in_a_value_hides_no_attribute() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_attributes=10)
    attrs = " ".join(f'a{i}="x>y"' for i in range(11))
    with pytest.raises(TooManyAttributesError):
        parse_document(f"<r {attrs}/>".encode(), limits)


def test_markup_inside_comments_cdata_and_pis_is_not_markup() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_attributes=2, max_name_length=10, max_namespaces_per_element=1)
    fake = '<fake a="1" b="2" c="3" xmlns:a="1" xmlns:b="2" NNNNNNNNNNNNNNNNNNNNNN="x">' * 50
    for wrapped in (f"<!--{fake}-->", f"<![CDATA[{fake}]]>", f"<?pi {fake}?>", f"<!-- <![CDATA[ -->{'x' * 3000}"):
        parse_document(f"<r>{wrapped}<e a='1'/></r>".encode(), limits)


def test_text_joined_across_cdata_sections_counts_whole() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_text_length=1000)
    parse_document(("<r>" + "<![CDATA[" + "x" * 500 + "]]>" + "y" * 500 + "</r>").encode(), limits)
    with pytest.raises(TextTooLongError):
        parse_document(("<r>" + "<![CDATA[" + "x" * 500 + "]]>" + "y" * 501 + "</r>").encode(), limits)
    parse_document(("<r>" + "x" * 600 + "<!-- split -->" + "y" * 600 + "</r>").encode(), limits)  # two nodes


def test_references_count_as_the_characters_they_stand_for() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_text_length=1000)
    parse_document(("<r>" + "&amp;" * 1000 + "</r>").encode(), limits)  # 5,000 written, 1,000 characters
    with pytest.raises(TextTooLongError):
        parse_document(("<r>" + "&amp;" * 1001 + "</r>").encode(), limits)
    parse_document(("<r a='" + "&#60;" * 1000 + "'/>").encode(), limits)
    with pytest.raises(TextTooLongError):
        parse_document(("<r a='" + "&#60;" * 1001 + "'/>").encode(), limits)


def test_namespaces_per_document_count_every_declaration() -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_namespaces_per_document=100)
    doc = "<r>" + "".join(f'<e xmlns="urn:{i % 3}"/>' for i in range(100)) + "</r>"
    parse_document(doc.encode(), limits)
    with pytest.raises(TooManyDocumentNamespacesError):
        parse_document(doc.replace("<r>", '<r xmlns:x="urn:x">').encode(), limits)
    parse_document(("<r>" + "xmlns " * 5000 + "</r>").encode(), limits)  # the word in text is no declaration


# pieces of a document body, each with the namespace declarations it makes (markup) or only seems to make
_DECLARING = st.sampled_from(
    [
        ('<e xmlns="urn:a"/>', 1),
        ('<e xmlns:p="urn:p" a="1"/>', 1),
        ("<e\n  xmlns:p = \"urn:p\"\txmlns:q='urn:q'>t</e>", 2),
        ("<e a=\" xmlns:x=&quot;u&quot; xmlns='v'\"/>", 0),  # the words in a value
        ('<!-- <e xmlns:p="urn:p"> -->', 0),
        ('<![CDATA[<e xmlns="urn:a" xmlns:b="urn:b">]]>', 0),
        ('<?pi <e xmlns:p="urn:p"?>', 0),
        (' xmlns="urn:a" xmlns:b="b" ', 0),  # in character data
        ('<e xmlnsx="1" xmlns-y="2"/>', 0),  # other names that begin with the word
        ("\n", 0),
    ]
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(_DECLARING, min_size=1, max_size=40),
    slice_size=st.sampled_from([8, 31, 64, 1 << 16]),
    over=st.booleans(),
)
def test_namespaces_per_document_counts_declarations_in_start_tags_only(
    monkeypatch: pytest.MonkeyPatch, pieces: list[tuple[str, int]], slice_size: int, over: bool
) -> None:
    """Only an attribute of a start tag named xmlns or xmlns:* declares a namespace (Namespaces in XML 1.0,
    section 3): the same words in comments, CDATA sections, processing instructions, character data or
    attribute values do not count, however the text is cut into pieces to be counted."""
    import gateway.intake.scan as scan

    monkeypatch.setattr(scan, "_SLICE", slice_size)
    declared = sum(n for _, n in pieces)
    assume(declared > 0)
    limit = declared - 1 if over else declared
    limits = dataclasses.replace(DEFAULT_LIMITS, max_namespaces_per_document=max(limit, 1) if limit else 1)
    assume(limits.max_namespaces_per_document == limit)
    doc = "<r>" + "".join(text for text, _ in pieces) + "</r>"
    if not over:
        parse_document(doc.encode(), limits)
        return
    with pytest.raises(TooManyDocumentNamespacesError) as info:
        parse_document(doc.encode(), limits)
    # the position is the start tag of the declaration that passes the limit
    seen, target = 0, None
    offset = len("<r>")
    for text, n in pieces:
        if seen < declared <= seen + n:
            target = offset
        seen += n
        offset += len(text)
    line = doc.count("\n", 0, target) + 1
    column = target - (doc.rfind("\n", 0, target) + 1) + 1
    assert (info.value.errors[0].line, info.value.errors[0].column) == (line, column)


def test_every_refusal_is_an_xml_security_error_with_a_position() -> None:
    with pytest.raises(XMLSecurityError) as info:
        parse_document(b"<r>\n<e " + b" ".join(b'a%d="1"' % i for i in range(201)) + b"/></r>")
    assert isinstance(info.value, TooManyAttributesError)
    assert (info.value.errors[0].line, info.value.errors[0].column) == (2, 1)


# --------------------------------------------------------------------------- cost


HOSTILE = {
    "100,000 attributes on the root": b"<r " + b" ".join(b'a%d="v"' % i for i in range(100_000)) + b"/>",
    "50,000 namespace declarations on the root": b"<r "
    + b" ".join(b'xmlns:p%d="u"' % i for i in range(50_000))
    + b"/>",
    "namespaces declared on 200,000 elements": b"<r>" + b'<e xmlns:p="u"/>' * 200_000 + b"</r>",
    "a 40,000-character name": b"<" + b"n" * 40_000 + b"/>",
    "a 9 MB text node": b"<r>" + b"x" * 9_000_000 + b"</r>",
    "a 9 MB attribute value": b"<r a='" + b"x" * 9_000_000 + b"'/>",
    "a 9 MB text with references": b"<r>" + b"xxxx&amp;" * 1_100_000 + b"</r>",
    "a 9 MB text in CDATA pieces": b"<r>" + b"<![CDATA[xxxxxxxxxxxxxxxxxxxxxx]]>" * 300_000 + b"</r>",
    "201 attributes on each of 5,000 elements": b"<r>"
    + (b"<e " + b" ".join(b'a%d="v"' % i for i in range(201)) + b"/>") * 5_000
    + b"</r>",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_documents_are_refused_quickly(name: str) -> None:
    start = time.perf_counter()
    with pytest.raises(IntakeLimitError):
        parse_document(HOSTILE[name])
    assert time.perf_counter() - start < 2.0, name  # tenths of a second on an idle machine


def test_a_document_under_every_limit_is_read_at_c_speed() -> None:
    """199 attributes on each of 5,000 elements (9 MB): every tag is read in full, and passes."""
    doc = b"<r>" + (b"<e " + b" ".join(b'a%d="v"' % i for i in range(199)) + b"/>") * 5_000 + b"</r>"
    start = time.perf_counter()
    parse_document(doc)
    assert time.perf_counter() - start < 3.0


# --------------------------------------------------------------------------- configuration


def test_every_limit_is_a_key_under_limits_checked_at_its_line() -> None:
    from gwtest import SAMPLE_CONFIG

    from gateway.config.loader import LIMIT_KEYS, load_settings, load_yaml, settings_from_mapping
    from gateway.errors import ConfigError

    assert load_settings(SAMPLE_CONFIG).limits == DEFAULT_LIMITS  # the sample states the defaults
    assert set(LIMIT_KEYS) == {"max_body_bytes", "max_depth", "max_elements", *CODES}
    text = "limits:\n  max_attributes: 20\n  max_name_length: 64\n  max_text_length: 1000\n"
    limits = settings_from_mapping(load_yaml(text=text, name="b.yaml")).limits
    assert (limits.max_attributes, limits.max_name_length, limits.max_text_length) == (20, 64, 1000)
    for bad, line in (
        ("limits:\n  max_attributes: 0\n", 2),
        ("limits:\n  max_depth: 5\n  max_name_length: many\n", 3),
        ("limits:\n  max_attribute: 5\n", 2),
        ("server:\n  explain_timeout: 20s\n", 2),
        ("server:\n  explain_workers: -1\n", 2),
        ("server:\n  port: 1\n  intake_workers: 17\n", 3),
    ):
        with pytest.raises(ConfigError) as info:
            settings_from_mapping(load_yaml(text=bad, name="b.yaml"))
        assert (info.value.file, info.value.line) == ("b.yaml", line), bad


@pytest.mark.parametrize(
    "document",
    [
        b"<n><!--x-->ZZZZ</n>",  # text after a comment
        b"<n><?pi x?>ZZZZ</n>",  # after a processing instruction
        b"<n><![CDATA[ab]]>ZZZZ</n>",  # after a CDATA section (it joins it)
        b"<n><!--<fake a='1'>-->ZZZZ</n>",  # after a comment holding a '<'
        b"<n xmlns:p='urn:p'><!--<f x='1' y='2' NNNNNNNN='x'>-->ZZ</n>",
    ],
)
def test_text_after_a_comment_pi_or_cdata_counts_against_max_text_length(document: bytes) -> None:
    limits = dataclasses.replace(DEFAULT_LIMITS, max_text_length=1)
    with pytest.raises(IntakeLimitError) as info:
        parse_document(document, limits)
    assert info.value.limit == "max_text_length"
    parse_document(document, dataclasses.replace(DEFAULT_LIMITS, max_text_length=6))  # within it: accepted


def test_text_split_by_a_comment_is_two_text_nodes() -> None:
    parse_document(b"<n>Z<!--a<b-->Z</n>", dataclasses.replace(DEFAULT_LIMITS, max_text_length=1))
