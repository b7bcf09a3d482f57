"""The words a partner reads for a schema-invalid document (gateway.intake.schema_messages through gateway.intake.schemas).

Invalid values of the common UBL types (dates, times, decimal amounts and
quantities, codes, indicators) must be reported in plain words naming the
element, the value and the XSD type expected, never with Python's internals.
"""

from __future__ import annotations

import copy
import re

import pytest
from gwtest import ORDER
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from lxml import etree

from gateway.errors import MAX_MESSAGE_CHARS, SchemaValidationError
from gateway.intake.schemas import UBL_NAMESPACES, SchemaRegistry
from gateway.intake.xmlsafe import parse_document

pytestmark = pytest.mark.filterwarnings("ignore::xmlschema.XMLSchemaImportWarning")

NS = {"ord": "urn:oasis:names:specification:ubl:schema:xsd:Order-2", **UBL_NAMESPACES}

#: What a partner must never read: Python classes, reprs, error texts and the libraries' names.
INTERNALS = re.compile(
    r"class '|elementpath|xmlschema|Xsd|Decimal|<class|<function| at 0x|int\(\)|float\(\)|invalid literal"
    r"|could not convert|[A-Za-z_]\w*\((?:ref|name|model)=|[\[{]'"
)

#: The element to spoil (first match in the sample order), its name in messages, and the XSD type it holds.
FIELDS = {
    "date": ("cbc:IssueDate", "xs:date"),
    "time": ("cbc:IssueTime", "xs:time"),
    "amount": ("cac:AllowanceCharge/cbc:Amount", "xs:decimal"),
    "quantity": ("cac:OrderLine/cac:LineItem/cbc:Quantity", "xs:decimal"),
    "indicator": ("cac:AllowanceCharge/cbc:ChargeIndicator", "xs:boolean"),
}

# Values near and far from each type's form; no '<' or '(' (so a message's own words are what is checked).
_CHARS = st.sampled_from(list("0123456789-:.+,TZEe abcxyz/_'\"&é٣\u00a0"))
_NOISE = st.text(_CHARS, max_size=24)
_NEAR = {
    "date": st.builds(
        "{:04d}-{:02d}-{:02d}{}".format,
        st.integers(0, 9999),
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from(["", "Z", "+25:00", "T10:00", " "]),
    ),
    "time": st.builds(
        "{:02d}:{:02d}:{:02d}{}".format,
        st.integers(0, 99),
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from(["", ".5", "Z", "+01:00", "am", ":00"]),
    ),
    "decimal": st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.decimals().map(lambda d: f"{d:,}"),
        st.integers().map(lambda i: f"{i}e3"),
    ),
    "boolean": st.sampled_from(["yes", "no", "TRUE", "False", "2", "-1", "", "t", "on", "1.0"]),
}
_VALUES = {name: st.one_of(_NEAR[xsd.removeprefix("xs:")], _NOISE) for name, (_, xsd) in FIELDS.items()}


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    reg = SchemaRegistry.ubl21(["Order"])
    reg.compile()
    return reg


def _errors(registry: SchemaRegistry, root: etree._Element) -> list | None:
    data = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    try:
        registry.validate(parse_document(data), source=data)
    except SchemaValidationError as exc:
        return exc.errors
    return None


def _plain(message: str) -> None:
    assert not INTERNALS.search(message), message
    assert len(message) <= MAX_MESSAGE_CHARS and "\n" not in message, message


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
)
@given(data=st.data(), field=st.sampled_from(sorted(FIELDS)))
def test_an_invalid_value_is_reported_in_plain_words(registry: SchemaRegistry, data: st.DataObject, field: str) -> None:
    path, xsd = FIELDS[field]
    value = data.draw(_VALUES[field], label="value")
    root = parse_document(ORDER)
    element = root.find(path, NS)
    element.text = value
    errors = _errors(registry, root)
    assume(errors is not None)  # a value of the right form: nothing to say
    name = path.rsplit("/", 1)[-1]
    [error] = [e for e in errors if e.path and e.path.endswith(name)]
    _plain(error.message)
    assert name in error.message and xsd in error.message, error.message
    shown = re.sub(r"[ \t\r\n]+", " ", value).strip(" ")  # as XML collapses it
    if shown:  # quoted as sent or as the schema's whitespace rule collapses it: the same words either way
        assert shown[:10] in re.sub(r"[ \t\r\n]+", " ", error.message), error.message
    else:
        assert "is empty" in error.message, error.message


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_NOISE.filter(lambda v: v.strip()))
def test_a_code_with_a_bad_language_is_reported_in_plain_words(registry: SchemaRegistry, value: str) -> None:
    root = parse_document(ORDER)
    code = root.find("cbc:DocumentCurrencyCode", NS)
    code.set("languageID", value)
    errors = _errors(registry, root)
    assume(errors is not None)
    [error] = errors
    _plain(error.message)
    assert "cbc:DocumentCurrencyCode" in error.message and "languageID" in error.message, error.message
    assert "xs:language" in error.message, error.message


def test_the_examples_a_partner_meets(registry: SchemaRegistry) -> None:
    cases = {
        ("cbc:IssueDate", "yesterday"): "cbc:IssueDate: 'yesterday' is not a valid date (xs:date, e.g. 2024-03-14).",
        (
            "cbc:IssueDate",
            "2024-02-30",
        ): "cbc:IssueDate: '2024-02-30' is not a valid date (xs:date, e.g. 2024-03-14); that month has no such day.",
        (
            "cbc:IssueTime",
            "25:00:00",
        ): "cbc:IssueTime: '25:00:00' is not a valid time (xs:time, e.g. 14:30:00); the hour must be from 0 to 23.",
        (
            "cac:OrderLine/cac:LineItem/cbc:Quantity",
            "1,5",
        ): "cbc:Quantity: '1,5' is not a valid decimal number (xs:decimal, e.g. 1234.56).",
        (
            "cac:OrderLine/cac:LineItem/cbc:Quantity",
            "",
        ): "cbc:Quantity is empty but must hold a valid decimal number (xs:decimal, e.g. 1234.56).",
        (
            "cac:AllowanceCharge/cbc:ChargeIndicator",
            "yes",
        ): "cbc:ChargeIndicator: 'yes' is not a valid boolean (xs:boolean: true, false, 1 or 0).",
    }
    for (path, value), expected in cases.items():
        root = parse_document(ORDER)
        root.find(path, NS).text = value
        [error] = _errors(registry, root)
        assert error.message == expected


def test_a_long_value_is_clipped_and_the_expected_type_kept(registry: SchemaRegistry) -> None:
    root = parse_document(ORDER)
    root.find("cbc:IssueDate", NS).text = "x" * 5000
    [error] = _errors(registry, root)
    assert error.message.endswith("(xs:date, e.g. 2024-03-14).") and "x" * 100 not in error.message
    assert len(error.message) < 150


def test_attributes_and_content_in_plain_words(registry: SchemaRegistry) -> None:
    root = parse_document(ORDER)
    amount = root.find("cac:AllowanceCharge/cbc:Amount", NS)
    del amount.attrib["currencyID"]
    root.find("cac:OrderLine/cac:LineItem/cbc:Quantity", NS).set("unitKode", "C62")
    code = root.find("cbc:DocumentCurrencyCode", NS)
    etree.SubElement(code, f"{{{NS['cbc']}}}Value").text = "SEK"
    root.remove(root.find("cbc:ID", NS))
    messages = {e.message for e in _errors(registry, root)}
    assert "cbc:Amount lacks its required attribute currencyID." in messages
    assert "cbc:Quantity does not allow the attribute unitKode." in messages
    assert "cbc:DocumentCurrencyCode must hold a value only, not child elements." in messages
    assert "cbc:IssueDate is not allowed here in Order; expected cbc:ID." in messages
    for message in messages:
        _plain(message)


_ORDER_ELEMENTS = sum(1 for _ in parse_document(ORDER).iter(etree.Element)) - 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["delete", "duplicate", "move up", "wrap"]), index=st.integers(0, _ORDER_ELEMENTS - 1))
def test_structure_errors_are_in_plain_words(registry: SchemaRegistry, op: str, index: int) -> None:
    root = parse_document(ORDER)
    target = list(root.iter(etree.Element))[1 + index]
    parent = target.getparent()
    if op == "delete":
        parent.remove(target)
    elif op == "duplicate":
        target.addnext(copy.deepcopy(target))
    elif op == "move up":
        parent.remove(target)
        parent.insert(0, target)
    else:
        etree.SubElement(target, f"{{{NS['cbc']}}}Note").text = "extra"
    for error in _errors(registry, root) or []:
        _plain(error.message)
