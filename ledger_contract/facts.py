"""The warehouse facts of a UBL 2.1 document: one extractor for the gateway
and the warehouse load.

The gateway calls :func:`for_ledger` at intake on the tree it has just
validated and stores the result in ``b2b_ledger.facts`` (with
``facts_version`` = :data:`VERSION`). The warehouse load uses those facts
when their version is current, else parses the stored XML and calls
:func:`extract` itself: both sides read a document the same way.

Each field is the XPath 1.0 ``string()`` of its path (the first node in
document order, trimmed; names and notes ``normalize-space``d). libxml2
evaluates them as one ``concat()`` of the header and one per line, joined by
a private-use character (faster in the gateway's event loop than a walk of
the tree in Python); the walk (:func:`_walk`) takes over when a value holds
that character. Amounts and quantities must fit ``decimal(18,6)`` and dates
be ``YYYY-MM-DD``, else :class:`BadDocumentError` (the warehouse quarantines the
document; the gateway accepts it without facts).

``b2b_ledger.facts`` is one JSON object per document, for a bulk
``pyarrow.json`` read: the header fields by name (absent when null) and
``lines`` column-oriented (``{"line_id": [...], ...}``); decimals and the
date are strings.
"""

from __future__ import annotations

import datetime as _dt
import logging
import re
from decimal import Decimal
from typing import Any

import orjson
from lxml import etree

from .errors import LedgerContractError

__all__ = [
    "AMOUNT_FIELDS",
    "BadDocumentError",
    "HEADER_FIELDS",
    "KINDS",
    "LINE_AMOUNT_FIELDS",
    "LINE_FIELDS",
    "LOADED_TYPES",
    "VERSION",
    "check_root",
    "encode",
    "extract",
    "for_ledger",
]

log = logging.getLogger(__name__)

#: Version of this extractor. Bump it whenever what :func:`extract` returns
#: for some document changes: the warehouse load then parses the XML of every
#: document whose stored facts carry an older version.
VERSION = 1

CAC = "{urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2}"
CBC = "{urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2}"
_ROOT_NS = "urn:oasis:names:specification:ubl:schema:xsd:{}-2"

#: Root local name -> the fact kind it feeds.
KINDS = {"Order": "order", "OrderChange": "change", "OrderCancellation": "cancellation", "Invoice": "invoice"}
#: Document types the warehouse loads (and the gateway extracts facts for).
LOADED_TYPES = tuple(KINDS)

_TOTALS = {
    "LineExtensionAmount": "line_extension_amount",
    "TaxExclusiveAmount": "tax_exclusive_amount",
    "TaxInclusiveAmount": "tax_inclusive_amount",
    "AllowanceTotalAmount": "allowance_total_amount",
    "ChargeTotalAmount": "charge_total_amount",
    "PrepaidAmount": "prepaid_amount",
    "PayableAmount": "payable_amount",
}
#: Header fields of the facts, in order (decimals as strings, issue_date ISO).
HEADER_FIELDS = (
    "kind", "doc_id", "order_ref", "type_code", "sequence_number", "party_a_id", "party_a_name", "party_b_id",
    "party_b_name", "issue_date", "currency", "note", "line_extension_amount", "tax_amount",
    "allowance_total_amount", "charge_total_amount", "tax_exclusive_amount", "tax_inclusive_amount",
    "prepaid_amount", "payable_amount", "ctl_lines", "ctl_line_amount", "ctl_payable_amount",
)  # fmt: skip
#: Header decimals, in the order they are checked.
AMOUNT_FIELDS = ("tax_amount", *_TOTALS.values())
#: Line fields of the facts, in order.
LINE_FIELDS = (
    "line_no", "line_id", "line_status", "ref_line_id", "item_id", "item_std_id", "item_name", "quantity",
    "unit_code", "price_amount", "line_amount", "tax_amount", "currency",
)  # fmt: skip
LINE_AMOUNT_FIELDS = ("quantity", "price_amount", "line_amount", "tax_amount")

_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})(?:Z|[+-]\d{2}:\d{2})?")
_NUMBER_RE = r"[+-]?(?:\d{1,12}(?:\.\d{0,6})?|\.\d{1,6})"
_NUMBER = re.compile(_NUMBER_RE)
#: Many numbers joined with NUL (a character no XML text can hold): one C-level check for all.
_NUMBERS = re.compile(rf"{_NUMBER_RE}(?:\x00{_NUMBER_RE})*")
_XML_SPACE = re.compile(r"[ \t\r\n]+")
_SIX = Decimal("0.000001")
_STRING = etree.XPath("string()", smart_strings=False)


class BadDocumentError(LedgerContractError, ValueError):
    """A document the warehouse cannot take (the message is the reason)."""


# --------------------------------------------------------------------------- the paths

# A field: (name, path, how). The path is a "/"-separated list of child tags
# ("cac:X" or "cbc:Y"), optionally ending in "@attr"; how is "s" (string,
# trimmed later), "n" (normalize-space), "nb" (string of the first node whose
# normalize-space is not empty) or "nbn" (normalize-space of that node).


def _party(role: str, prefix: str) -> list[tuple[str, str, str]]:
    party = f"cac:{role}/cac:Party"
    return [
        (f"{prefix}_pid", f"{party}/cac:PartyIdentification/cbc:ID", "nb"),
        (f"{prefix}_endpoint", f"{party}/cbc:EndpointID", "s"),
        (f"{prefix}_pname", f"{party}/cac:PartyName/cbc:Name", "nbn"),
        (f"{prefix}_legal", f"{party}/cac:PartyLegalEntity/cbc:RegistrationName", "n"),
    ]


def _header_paths(kind: str) -> list[tuple[str, str, str]]:
    a, b = (
        ("AccountingSupplierParty", "AccountingCustomerParty")
        if kind == "invoice"
        else ("BuyerCustomerParty", "SellerSupplierParty")
    )
    total = "cac:LegalMonetaryTotal" if kind == "invoice" else "cac:AnticipatedMonetaryTotal"
    paths = [
        ("doc_id", "cbc:ID", "s"),
        ("issue_date", "cbc:IssueDate", "s"),
        ("currency", "cbc:DocumentCurrencyCode", "s"),
        ("order_ref", "cac:OrderReference/cbc:ID", "s"),
        ("type_code", "cbc:InvoiceTypeCode", "s"),
        ("sequence_number", "cbc:SequenceNumberID", "s"),
        ("note", "cbc:CancellationNote", "n"),
        ("tax_amount", "cac:TaxTotal/cbc:TaxAmount", "s"),
        ("tax_currency", "cac:TaxTotal/cbc:TaxAmount/@currencyID", "s"),
        ("total_currency", f"{total}/cbc:PayableAmount/@currencyID", "s"),
        *_party(a, "a"),
        *_party(b, "b"),
    ]  # fmt: skip
    paths += [(name, f"{total}/cbc:{element}", "s") for element, name in _TOTALS.items()]
    return paths


_ITEM_PATHS = [
    ("item_name", "cac:Item/cbc:Name", "n"),
    ("item_desc", "cac:Item/cbc:Description", "n"),
    ("sellers_id", "cac:Item/cac:SellersItemIdentification/cbc:ID", "s"),
    ("buyers_id", "cac:Item/cac:BuyersItemIdentification/cbc:ID", "s"),
    ("item_std_id", "cac:Item/cac:StandardItemIdentification/cbc:ID", "s"),
    ("price_amount", "cac:Price/cbc:PriceAmount", "s"),
]
_ORDER_LINE = ("cac:OrderLine/cac:LineItem", [
    ("line_id", "cbc:ID", "s"),
    ("line_status", "cbc:LineStatusCode", "s"),
    ("quantity", "cbc:Quantity", "s"),
    ("unit_code", "cbc:Quantity/@unitCode", "s"),
    ("line_amount", "cbc:LineExtensionAmount", "s"),
    ("currency", "cbc:LineExtensionAmount/@currencyID", "s"),
    ("tax_amount", "cbc:TotalTaxAmount", "s"),
    *_ITEM_PATHS,
])  # fmt: skip
_INVOICE_LINE = ("cac:InvoiceLine", [
    ("line_id", "cbc:ID", "s"),
    ("quantity", "cbc:InvoicedQuantity", "s"),
    ("unit_code", "cbc:InvoicedQuantity/@unitCode", "s"),
    ("line_amount", "cbc:LineExtensionAmount", "s"),
    ("currency", "cbc:LineExtensionAmount/@currencyID", "s"),
    ("tax_amount", "cac:TaxTotal/cbc:TaxAmount", "s"),
    ("ref_line_id", "cac:OrderLineReference/cbc:LineID", "s"),
    *_ITEM_PATHS,
])  # fmt: skip
_LINES_BY_KIND = {"order": _ORDER_LINE, "change": _ORDER_LINE, "invoice": _INVOICE_LINE, "cancellation": None}


def _tag(step: str) -> str:
    prefix, local = step.split(":")
    return {"cac": CAC, "cbc": CBC}[prefix] + local


class _Node:
    """One element of a path tree: what to record from it, where to go next."""

    __slots__ = ("leaves", "simple", "children", "record")

    def __init__(self) -> None:
        self.leaves: list[tuple[str, str, str | None]] = []  # (field, how, attribute or None)
        self.simple: str | None = None  # the field, when the only leaf is a plain string()
        self.children: dict[str, _Node] = {}
        self.record: _Node | None = None  # a line: walk this tree into a fresh dict


def _compile(paths: list[tuple[str, str, str]], root: _Node | None = None) -> _Node:
    root = root or _Node()
    for name, path, how in paths:
        steps = path.split("/")
        attr = steps.pop()[1:] if steps[-1].startswith("@") else None
        node = root
        for step in steps:
            node = node.children.setdefault(_tag(step), _Node())
        node.leaves.append((name, how, attr))
    _finish(root)
    return root


def _finish(node: _Node) -> None:
    if len(node.leaves) == 1 and node.leaves[0][1:] == ("s", None):
        node.simple = node.leaves[0][0]
    for child in node.children.values():
        _finish(child)


def _tree(kind: str) -> _Node:
    root = _compile(_header_paths(kind))
    lines = _LINES_BY_KIND[kind]
    if lines is not None:
        path, fields = lines
        node = root
        for step in path.split("/"):
            node = node.children.setdefault(_tag(step), _Node())
        node.record = _compile(fields)
    return root


_TREES = {kind: _tree(kind) for kind in KINDS.values()}


def _walk(el: etree._Element, node: _Node, vals: dict[str, str | None], lines: list[dict[str, str | None]]) -> None:
    """Record into *vals* the first value of every field under *el* (trimmed,
    None when blank; a field met again keeps its first value) and append one
    dict per line to *lines*."""
    children = node.children
    for child in el:
        sub = children.get(child.tag)
        if sub is None:
            continue
        name = sub.simple
        if name is not None:
            if name not in vals:
                vals[name] = ((child.text or "") if not len(child) else _STRING(child)).strip() or None
        elif sub.leaves:
            _leaves(child, sub, vals)
        if sub.children:
            _walk(child, sub, vals, lines)
        if sub.record is not None:
            line: dict[str, str | None] = {}
            _walk(child, sub.record, line, lines)
            lines.append(line)


def _leaves(child: etree._Element, sub: _Node, vals: dict[str, str | None]) -> None:
    for name, how, attr in sub.leaves:
        if name in vals:
            continue
        if attr is not None:
            value = child.get(attr)
            if value is not None:  # @attr: the first such attribute, on whichever node has it
                vals[name] = value.strip() or None
            continue
        value = (child.text or "") if not len(child) else _STRING(child)
        if how == "s":
            vals[name] = value.strip() or None
        else:
            norm = _XML_SPACE.sub(" ", value).strip(" \t\r\n")
            if how == "n":
                vals[name] = norm.strip() or None
            elif norm:  # "nb", "nbn": the first node whose normalize-space() is not empty
                vals[name] = (norm if how == "nbn" else value).strip() or None


# --------------------------------------------------------------------------- the same, in libxml2

#: Joins the values of one XPath ``concat()``: a character no UBL document is expected to hold (private
#: use); a value that holds it all the same shows as one value too many, and the Python walk takes over.
_SEP = "\ue000"
_NS = {"cac": CAC[1:-1], "cbc": CBC[1:-1]}
_HOW = {
    "s": "string({})",
    "n": "normalize-space({})",
    "nb": "string(({})[normalize-space()][1])",
    "nbn": "normalize-space(({})[normalize-space()][1])",
}


def _concat(paths: list[tuple[str, str, str]]) -> tuple[tuple[str, ...], etree.XPath]:
    """The field names of *paths*, and one XPath giving all their values joined by :data:`_SEP`."""
    parts = []
    for _, path, how in paths:
        if "@" in path:
            parts.append(f"string({path})")  # the first such attribute, on whichever node has it
        else:
            parts.append(_HOW[how].format(path))
    joined = f",'{_SEP}',".join(parts)  # and a last '': concat() takes two arguments at least
    xpath = etree.XPath(f"concat({joined},'')", namespaces=_NS, smart_strings=False)
    return tuple(name for name, _, _ in paths), xpath


def _xpaths(kind: str) -> tuple[Any, ...]:
    header = _concat(_header_paths(kind))
    lines = _LINES_BY_KIND[kind]
    if lines is None:
        return header, None, None
    path, fields = lines
    return header, etree.XPath(path, namespaces=_NS), _concat(fields)


_XPATHS = {kind: _xpaths(kind) for kind in KINDS.values()}


def _values(names: tuple[str, ...], xpath: etree.XPath, el: etree._Element) -> dict[str, str | None] | None:
    values = xpath(el).split(_SEP)
    if len(values) != len(names):
        return None
    return {name: value.strip() or None for name, value in zip(names, values, strict=False)}


def _collect(root: etree._Element, kind: str) -> tuple[dict[str, str | None], list[dict[str, str | None]]]:
    """What :func:`_walk` records (as None where the walk records nothing), each path evaluated by libxml2."""
    (names, header), line_nodes, line = _XPATHS[kind]
    raw = _values(names, header, root)
    raw_lines: list[dict[str, str | None]] = []
    if raw is not None and line_nodes is not None:
        line_names, line_xpath = line
        for node in line_nodes(root):
            values = _values(line_names, line_xpath, node)
            if values is None:
                raw = None
                break
            raw_lines.append(values)
    if raw is None:  # a value held the joining character
        raw, raw_lines = {}, []
        _walk(root, _TREES[kind], raw, raw_lines)
    return raw, raw_lines


# --------------------------------------------------------------------------- values


def _date(value: str | None, what: str) -> str:
    if value is None:
        raise BadDocumentError(f"missing {what}")
    m = _DATE.fullmatch(value)
    if m is None:
        raise BadDocumentError(f"{what} {value[:40]!r} is not a date (YYYY-MM-DD)")
    try:
        _dt.date.fromisoformat(m.group(1))
    except ValueError:
        raise BadDocumentError(f"{what} {value[:40]!r} is not a valid date") from None
    return m.group(1)


def _num(value: str | None, what: str) -> None:
    if value is not None and _NUMBER.fullmatch(value) is None:
        raise BadDocumentError(f"{what} {value[:40]!r} is not a number with at most 12 digits and 6 decimals")


def check_root(root: etree._Element, doc_type: str) -> str:
    """The fact kind of *root*, after checking it is the UBL 2 *doc_type* (BadDocumentError otherwise)."""
    qname = etree.QName(root)
    if qname.localname != doc_type:
        raise BadDocumentError(f"the root element is {qname.localname}, the ledger says {doc_type}")
    if qname.namespace != _ROOT_NS.format(doc_type):
        raise BadDocumentError(f"the root namespace {qname.namespace!r} is not UBL 2 {doc_type}")
    return KINDS[doc_type]


def extract(root: etree._Element, doc_type: str) -> tuple[dict[str, Any], int, dict[str, list[Any]]]:
    """``(header, n_lines, lines)`` of a parsed document of a loaded type.

    *header* maps :data:`HEADER_FIELDS` to values (None when absent; decimals
    as the document spells them, ``issue_date`` ``YYYY-MM-DD``, the control
    totals computed with :class:`~decimal.Decimal`); *lines* maps
    :data:`LINE_FIELDS` to one value per line (empty when there is none).
    Raises :class:`BadDocumentError` with the reason.
    """
    if doc_type not in KINDS:
        raise BadDocumentError(f"{doc_type} is not loaded into the warehouse")
    if root.getroottree().docinfo.doctype:
        raise BadDocumentError("a DOCTYPE is not allowed")
    kind = check_root(root, doc_type)
    raw, raw_lines = _collect(root, kind)

    get = raw.get
    h: dict[str, Any] = dict.fromkeys(HEADER_FIELDS)
    h["kind"] = kind
    doc_id = get("doc_id")
    if not doc_id:
        raise BadDocumentError("missing cbc:ID")
    h["doc_id"] = doc_id
    h["issue_date"] = _date(get("issue_date"), "cbc:IssueDate")
    order_ref = get("order_ref")
    if kind in ("change", "cancellation"):
        if not order_ref:
            raise BadDocumentError("missing cac:OrderReference/cbc:ID (the order it refers to)")
        seqno = get("sequence_number")
        if seqno is not None:
            if not seqno.isdigit() or len(seqno) > 18:
                raise BadDocumentError(f"cbc:SequenceNumberID {seqno[:40]!r} is not a whole number")
            h["sequence_number"] = int(seqno)
    h["order_ref"] = order_ref
    if kind == "invoice":
        h["type_code"] = get("type_code")
    if kind == "cancellation":
        h["note"] = get("note")
    h["currency"] = get("currency") or get("total_currency") or get("tax_currency")
    for name in AMOUNT_FIELDS:
        h[name] = get(name)
    h["party_a_id"] = get("a_pid") or get("a_endpoint")
    h["party_a_name"] = get("a_pname") or get("a_legal")
    h["party_b_id"] = get("b_pid") or get("b_endpoint")
    h["party_b_name"] = get("b_pname") or get("b_legal")

    n = len(raw_lines)
    lines: dict[str, list[Any]] = {}
    total = Decimal(0)
    if n:
        ids = [r.get("line_id") for r in raw_lines]
        if None in ids:
            raise BadDocumentError(f"line {ids.index(None) + 1} has no cbc:ID")
        amounts = [r.get("line_amount") for r in raw_lines]
        std = [r.get("item_std_id") for r in raw_lines]
        lines = {
            "line_no": list(range(1, n + 1)),
            "line_id": ids,
            "line_status": [r.get("line_status") for r in raw_lines],
            "ref_line_id": [r.get("ref_line_id") for r in raw_lines],
            "item_id": [r.get("sellers_id") or r.get("buyers_id") or s for r, s in zip(raw_lines, std, strict=False)],
            "item_std_id": std,
            "item_name": [r.get("item_name") or r.get("item_desc") for r in raw_lines],
            "quantity": [r.get("quantity") for r in raw_lines],
            "unit_code": [r.get("unit_code") for r in raw_lines],
            "price_amount": [r.get("price_amount") for r in raw_lines],
            "line_amount": amounts,
            "tax_amount": [r.get("tax_amount") for r in raw_lines],
            "currency": [r.get("currency") for r in raw_lines],
        }
    # every decimal must fit decimal(18,6): one check for all, the reason found value by value
    numbers = [v for v in (h[name] for name in AMOUNT_FIELDS) if v is not None]
    if n:
        for name in LINE_AMOUNT_FIELDS:
            numbers.extend(v for v in lines[name] if v is not None)
    if numbers and _NUMBERS.fullmatch("\x00".join(numbers)) is None:
        _bad_number(h, n, lines)
    # control totals (Python Decimal): what reconciliation expects back from the warehouse
    if n:
        total = sum(map(Decimal, filter(None, lines["line_amount"])), total)
    h["ctl_lines"] = n
    h["ctl_line_amount"] = str(total.quantize(_SIX))
    payable = h["payable_amount"]
    if payable is not None:
        h["ctl_payable_amount"] = str(Decimal(payable).quantize(_SIX))
    return h, n, lines


def _bad_number(h: dict[str, Any], n: int, lines: dict[str, list[Any]]) -> None:
    """Raise BadDocumentError for the first decimal that does not fit, in reading order."""
    if n:
        for line_id, amount in zip(lines["line_id"], lines["line_amount"], strict=False):
            _num(amount, f"line {line_id} LineExtensionAmount")
    _num(h["payable_amount"], "PayableAmount")
    for name in AMOUNT_FIELDS:
        _num(h[name], name)
    if n:
        for name in LINE_AMOUNT_FIELDS:
            for line_id, value in zip(lines["line_id"], lines[name], strict=False):
                _num(value, f"line {line_id} {name}")
    raise BadDocumentError("a decimal does not fit decimal(18,6)")  # pragma: no cover - one of the above raised


def encode(header: dict[str, Any], lines: dict[str, list[Any]]) -> str:
    """The ``b2b_ledger.facts`` JSON of an extracted document (see the module doc)."""
    obj = {k: v for k, v in header.items() if v is not None}
    if lines:
        obj["lines"] = lines
    return orjson.dumps(obj).decode("utf-8")  # compact, UTF-8 as it is; values are str, int or None


def for_ledger(root: etree._Element, doc_type: str) -> str | None:
    """The facts JSON to store with an accepted document, or None: when its
    type is not loaded into the warehouse, or when anything at all goes wrong
    (the warehouse load then parses the XML itself, and quarantines it when
    it must). Never raises: a valid document is never refused for its facts.
    ``bench/etl_bench.py`` measures its CPU time.
    """
    if doc_type not in KINDS:
        return None
    try:
        header, _, lines = extract(root, doc_type)
        return encode(header, lines)
    except BadDocumentError as exc:
        log.debug("no warehouse facts for a %s: %s", doc_type, exc)
    except Exception:  # never fail an intake for the warehouse's sake
        log.warning("extracting the warehouse facts of a %s failed", doc_type, exc_info=True)
    return None
