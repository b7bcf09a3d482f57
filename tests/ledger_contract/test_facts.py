"""ledger_contract.facts: libxml2's evaluation of the paths (one XPath ``concat()``
of the header, one per line) reads every document exactly as the walk of the
same paths does, which states their XPath ``string()`` semantics in Python,
and the walk takes over when a value holds the character that joins them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from lxml import etree

from ledger_contract import facts

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "ubl-2.1" / "xml"
ORDER = (EXAMPLES / "UBL-Order-2.1-Example.xml").read_bytes()
INVOICE = (EXAMPLES / "UBL-Invoice-2.1-Example.xml").read_bytes()
ORDER_CHANGE = (EXAMPLES / "UBL-OrderChange-2.1-Example.xml").read_bytes()
ORDER_CANCELLATION = (EXAMPLES / "UBL-OrderCancellation-2.1-Example.xml").read_bytes()

DOCS = {"Order": ORDER, "Invoice": INVOICE, "OrderChange": ORDER_CHANGE, "OrderCancellation": ORDER_CANCELLATION}
LEAF = re.compile(r"<(cbc:\w+)([^<>]*)>([^<]*)</\1>")
TEXTS = st.one_of(
    st.sampled_from(["", " ", "\n\t ", "x", " x  y ", "\u00a0", facts._SEP]),  # blank, spaced, the joiner
    st.text(st.sampled_from(["a", "7", ".", " ", "\t", "\n", "\u00a0", "é", facts._SEP]), max_size=6),
)


def _walked(root: etree._Element, kind: str) -> tuple[dict, list[dict]]:
    raw: dict = {}
    lines: list[dict] = []
    facts._walk(root, facts._TREES[kind], raw, lines)
    return raw, lines


def _same(a: dict, b: dict) -> bool:
    """Equal as extract() reads them: a field the walk never met is None."""
    return all(a.get(k) == b.get(k) for k in a.keys() | b.keys())


def _assert_read_alike(root: etree._Element, doc_type: str) -> None:
    kind = facts.KINDS[doc_type]
    (raw, lines), (walked, walked_lines) = facts._collect(root, kind), _walked(root, kind)
    assert _same(raw, walked), {k: (raw.get(k), walked.get(k)) for k in raw.keys() | walked.keys()}
    assert len(lines) == len(walked_lines) and all(map(_same, lines, walked_lines))


#: The elements the paths end on (their text or attributes are the values).
FIELD_TAGS = sorted(
    {
        path.split("/")[-1] if "@" not in path else path.split("/")[-2]
        for kind in facts.KINDS.values()
        for _, path, _ in facts._header_paths(kind) + facts._ORDER_LINE[1] + facts._INVOICE_LINE[1]
    }
)


def _edit(doc: str, op: tuple) -> str:
    """One edit of a leaf element: the index-th of those named ``tag`` still there."""
    what, tag, index, text = op
    leaves = [m for m in LEAF.finditer(doc) if m.group(1) == tag]
    if not leaves:
        return doc
    leaf = leaves[index % len(leaves)]
    tag, attrs, value = leaf.groups()
    escaped = text.replace("&", "&amp;").replace("<", "&lt;")
    new = {
        "text": f"<{tag}{attrs}>{escaped}</{tag}>",  # blank, spaced out, another value...
        "comment": f"<{tag}{attrs}>{value[:1]}<!-- c -->{value[1:]}</{tag}>",  # string() spans the comment
        "drop": "",  # the field is absent, or a later occurrence becomes the first
        "twin": f"<{tag}>{escaped}</{tag}>{leaf.group(0)}",  # an earlier occurrence, without attributes
        "bare": f"<{tag}>{value}</{tag}>",  # its attributes (currencyID, unitCode...) gone
    }[what]
    return doc[: leaf.start()] + new + doc[leaf.end() :]


EDITS = st.tuples(
    st.sampled_from(["text", "comment", "drop", "twin", "bare"]), st.sampled_from(FIELD_TAGS), st.integers(0, 30), TEXTS
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc_type=st.sampled_from(sorted(DOCS)), edits=st.lists(EDITS, max_size=12))
@example(doc_type="Order", edits=[("twin", "cbc:ID", 7, " ")])  # a blank first id of the buyer ("nb")
@example(doc_type="Order", edits=[("twin", "cbc:Name", 0, "\n ")])  # a blank first name of the buyer ("nbn")
@example(doc_type="Order", edits=[("comment", "cbc:ID", 0, ""), ("text", "cbc:Name", 7, " x  y ")])
@example(doc_type="Invoice", edits=[("bare", "cbc:PayableAmount", 0, ""), ("drop", "cbc:TaxAmount", 0, "")])
def test_the_xpaths_read_any_edited_document_as_the_walk_does(doc_type, edits):
    doc = DOCS[doc_type].decode("utf-8")
    for op in edits:
        doc = _edit(doc, op)
    root = etree.fromstring(doc.encode("utf-8"))
    _assert_read_alike(root, doc_type)
    try:
        facts.extract(root, doc_type)
    except facts.BadDocumentError:
        pass  # a document the warehouse quarantines; never any other error


@pytest.mark.parametrize("doc_type", sorted(DOCS))
def test_the_official_examples_are_read_alike(doc_type):
    _assert_read_alike(etree.fromstring(DOCS[doc_type]), doc_type)


def test_a_value_holding_the_joining_character_is_read_by_the_walk(monkeypatch):
    name = f"Johnssons{facts._SEP}byggvaror"
    doc = ORDER.replace(b"<cbc:Name>Johnssons byggvaror</cbc:Name>", f"<cbc:Name>{name}</cbc:Name>".encode(), 1)
    assert doc != ORDER
    walks = []
    real_walk = facts._walk

    def counting(el, node, vals, lines):
        walks.append(el)
        return real_walk(el, node, vals, lines)

    monkeypatch.setattr(facts, "_walk", counting)
    root = etree.fromstring(doc)
    header, n, lines = facts.extract(root, "Order")
    assert walks and header["party_a_name"] == name and header["doc_id"] == "34" and n == 2
    walks.clear()
    facts.extract(etree.fromstring(ORDER), "Order")
    assert walks == []  # the walk is the exception, not the rule


def test_a_line_value_holding_the_joining_character_is_read_by_the_walk():
    doc = ORDER.replace(b"<cbc:Name>Pensel 20 mm</cbc:Name>", f"<cbc:Name>Pensel{facts._SEP}</cbc:Name>".encode(), 1)
    assert doc != ORDER
    header, n, lines = facts.extract(etree.fromstring(doc), "Order")
    assert n == 2 and lines["item_name"] == ["Falu Rödfärg", f"Pensel{facts._SEP}"]
    assert header["party_a_name"] == "Johnssons byggvaror"
