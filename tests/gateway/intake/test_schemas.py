"""Tests of gateway.intake.schemas: the registry, validation, rich errors, path checks."""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from pathlib import Path

import pytest
from gwtest import listening_socket
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from gateway.errors import (
    MAX_MESSAGE_CHARS,
    ConfigError,
    SchemaValidationError,
    UnknownSchemaError,
)
from gateway.intake.schemas import UBL_NAMESPACES, LocalSchemaResolver, SchemaRegistry, element_path
from gateway.intake.xmlsafe import parse_document
from xml_schemas import UBL_21_DIR, schema_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
UBL_EXAMPLES = Path(__file__).resolve().parents[3].parent / "shared" / "ubl-2.1" / "xml"
ORDER_EXAMPLE = UBL_EXAMPLES / "UBL-Order-2.1-Example.xml"
ORDER = ORDER_EXAMPLE.read_bytes()
ORDER_NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
NS = {"ord": ORDER_NS, **UBL_NAMESPACES}

CONFIGURED = ["Order", "OrderResponse", "OrderChange", "OrderCancellation", "DespatchAdvice", "Invoice"]

pytestmark = pytest.mark.filterwarnings("ignore::xmlschema.XMLSchemaImportWarning")


@pytest.fixture(scope="module")
def registry() -> SchemaRegistry:
    reg = SchemaRegistry.ubl21()
    reg.compile([f"ubl-2.1/{d}" for d in CONFIGURED])
    return reg


def line_of(data: bytes, needle: str, occurrence: int = 1) -> tuple[int, int]:
    """1-based line and column of the n-th occurrence of needle in the document text."""
    text = data.decode("utf-8")
    index = -1
    for _ in range(occurrence):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, column


def invalid(data: bytes, registry: SchemaRegistry, schema: str | None = None) -> SchemaValidationError:
    with pytest.raises(SchemaValidationError) as info:
        registry.validate(parse_document(data), schema, source=data)
    return info.value


# --------------------------------------------------------------------------- vendored files


def test_vendored_schemas_are_the_official_ones_unchanged() -> None:
    official = UBL_EXAMPLES.parent / "xsdrt"
    for folder in ("common", "maindoc"):
        ours = sorted(p.name for p in (UBL_21_DIR / folder).iterdir())
        theirs = sorted(p.name for p in (official / folder).iterdir())
        assert ours == theirs
        for name in ours:
            assert (UBL_21_DIR / folder / name).read_bytes() == (official / folder / name).read_bytes(), name
    assert len(ours) == 65  # the maindoc folder


def test_schema_path() -> None:
    path = schema_path("ubl-2.1", "maindoc", "UBL-Order-2.1.xsd")
    assert path.is_file() and path.is_absolute()
    with pytest.raises(ValueError):
        schema_path("..", "gateway", "errors.py")
    with pytest.raises(FileNotFoundError):
        schema_path("ubl-2.1", "maindoc", "UBL-Nothing-2.1.xsd")


# --------------------------------------------------------------------------- registry


def test_ubl21_registers_all_maindocs_by_name_and_root(registry: SchemaRegistry) -> None:
    assert len(registry) == 65
    assert "ubl-2.1/Order" in registry.names
    assert registry.for_root(f"{{{ORDER_NS}}}Order") == "ubl-2.1/Order"
    assert registry.roots("ubl-2.1/Order") == {f"{{{ORDER_NS}}}Order"}
    assert f"{{{ORDER_NS}}}Order" in registry
    assert registry.for_root("{urn:nothing}Order") is None


def test_compile_reports_times_and_is_idempotent() -> None:
    reg = SchemaRegistry.ubl21(["Order", "Invoice"])
    timings = reg.compile()
    assert set(timings) == {"ubl-2.1/Order", "ubl-2.1/Invoice", "xmlschema:ubl-2.1"}
    assert all(t > 0 for t in timings.values())
    assert reg.compile() == {"ubl-2.1/Order": timings["ubl-2.1/Order"], "ubl-2.1/Invoice": timings["ubl-2.1/Invoice"]}


def test_unknown_schema_names() -> None:
    reg = SchemaRegistry.ubl21(["Order"])
    with pytest.raises(UnknownSchemaError) as info:
        reg.compile(["ubl-2.1/Nope"])
    assert info.value.status == 500 and info.value.code == "unknown-schema"
    assert "ubl-2.1/Nope" in info.value.detail
    with pytest.raises(UnknownSchemaError):
        reg.validate(parse_document(ORDER), "ubl-2.1/Nope")
    with pytest.raises(UnknownSchemaError):
        SchemaRegistry.ubl21(["Order", "NoSuchDocument"])


def test_duplicate_names_are_refused() -> None:
    reg = SchemaRegistry.ubl21(["Order"])
    with pytest.raises(ConfigError):
        reg.register("ubl-2.1/Order", schema_path("ubl-2.1", "maindoc", "UBL-Order-2.1.xsd"))


# --------------------------------------------------------------------------- valid documents


EXAMPLES = sorted(UBL_EXAMPLES.glob("*.xml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_official_example_validates(path: Path, registry: SchemaRegistry) -> None:
    data = path.read_bytes()
    root = parse_document(data)
    name = registry.for_root(root.tag)
    assert name is not None, f"no maindoc schema for {root.tag}"
    assert name == "ubl-2.1/" + etree.QName(root).localname
    registry.validate(root, source=data)  # by root
    registry.validate(root, name)  # by name
    assert registry.is_valid(root)


def test_there_are_official_examples_to_check() -> None:
    assert len(EXAMPLES) >= 30


def test_the_despatch_advice_fixture_validates(registry: SchemaRegistry) -> None:
    data = (FIXTURES / "UBL-DespatchAdvice-2.1-Valid.xml").read_bytes()
    root = parse_document(data)
    registry.validate(root, "ubl-2.1/DespatchAdvice", source=data)
    assert registry.for_root(root.tag) == "ubl-2.1/DespatchAdvice"


def test_xmlschema_agrees_the_examples_are_valid(registry: SchemaRegistry) -> None:
    bundle = registry.xmlschema("ubl-2.1/Order")
    assert bundle is registry.xmlschema("ubl-2.1/DespatchAdvice")  # one bundle for the group
    for path in [ORDER_EXAMPLE, FIXTURES / "UBL-DespatchAdvice-2.1-Valid.xml"]:
        assert bundle.is_valid(parse_document(path.read_bytes()), use_location_hints=False)


# --------------------------------------------------------------------------- invalid documents


def test_missing_mandatory_element(registry: SchemaRegistry) -> None:
    data = ORDER.replace(b"<cbc:ID>34</cbc:ID>", b"", 1)
    assert not registry.is_valid(parse_document(data))
    err = invalid(data, registry)
    assert err.status == 400 and err.code == "schema-invalid" and err.schema == "ubl-2.1/Order"
    [e] = err.errors
    assert (e.line, e.column) == line_of(data, "<cbc:IssueDate>2010-01-20")
    assert e.path == "/Order/cbc:IssueDate"
    assert "cbc:ID" in e.message and "IssueDate" in e.message
    assert "line 10" in err.detail


def test_text_in_a_numeric_field(registry: SchemaRegistry) -> None:
    data = ORDER.replace(
        b'<cbc:Quantity unitCode="C62">15</cbc:Quantity>', b'<cbc:Quantity unitCode="C62">fifteen</cbc:Quantity>'
    )
    err = invalid(data, registry)
    [e] = err.errors
    assert e.path == "/Order/cac:OrderLine[2]/cac:LineItem/cbc:Quantity"
    assert (e.line, e.column) == line_of(data, '<cbc:Quantity unitCode="C62">fifteen')
    assert "fifteen" in e.message and "decimal" in e.message


def test_every_error_is_listed_in_document_order(registry: SchemaRegistry) -> None:
    data = (
        ORDER.replace(b"<cbc:ID>34</cbc:ID>", b"", 1)
        .replace(b'unitCode="LTR">120<', b'unitCode="LTR">abc<')
        .replace(b"<cbc:IssueTime>12:30:00</cbc:IssueTime>", b"<cbc:IssueTime>half past</cbc:IssueTime>")
    )
    err = invalid(data, registry)
    assert len(err.errors) >= 3
    lines = [e.line for e in err.errors]
    assert lines == sorted(lines)
    for e in err.errors:
        assert e.line and e.column and e.path and e.path.startswith("/Order") and e.message
    paths = [e.path for e in err.errors]
    assert "/Order/cac:OrderLine[1]/cac:LineItem/cbc:Quantity" in paths
    assert "/Order/cbc:IssueTime" in paths
    body = err.to_dict()
    assert body["errors"][0].keys() == {"line", "column", "path", "message"}


def test_without_the_source_bytes_lines_remain(registry: SchemaRegistry) -> None:
    data = ORDER.replace(b'unitCode="LTR">120<', b'unitCode="LTR">abc<')
    with pytest.raises(SchemaValidationError) as info:
        registry.validate(parse_document(data))
    [e] = info.value.errors
    assert e.line == line_of(data, 'unitCode="LTR">abc')[0]
    assert e.column is None


def test_wrong_attribute_and_unexpected_element(registry: SchemaRegistry) -> None:
    data = ORDER.replace(b'<cbc:Quantity unitCode="LTR">', b'<cbc:Quantity unitKode="LTR">').replace(
        b"<cbc:Note>Information text for the whole order</cbc:Note>",
        b"<cbc:Note>Information text for the whole order</cbc:Note><cbc:Bogus>1</cbc:Bogus>",
    )
    err = invalid(data, registry)
    messages = " | ".join(e.message for e in err.errors)
    assert "unitKode" in messages and "Bogus" in messages
    assert {e.path for e in err.errors} >= {"/Order/cbc:Bogus", "/Order/cac:OrderLine[1]/cac:LineItem/cbc:Quantity"}


def test_errors_are_capped_and_counted(registry: SchemaRegistry) -> None:
    root = parse_document(ORDER)
    line = root.find("cac:OrderLine", NS)
    for _ in range(80):
        clone = copy.deepcopy(line)
        clone.find("cac:LineItem/cbc:Quantity", NS).text = "x" * 5000
        root.append(clone)
    data = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    err = invalid(data, registry)
    assert len(err.errors) == 50
    assert err.omitted == 30
    assert err.to_dict()["omitted_errors"] == 30
    assert all(len(e.message) <= MAX_MESSAGE_CHARS for e in err.errors)
    assert len(json.dumps(err.to_dict())) < 60_000
    assert "80 errors" in err.detail


def test_large_documents_fall_back_to_libxml2_errors_with_prefixed_names() -> None:
    reg = SchemaRegistry.ubl21(["Order"], detail_max_elements=10)
    reg.compile(details=False)
    data = ORDER.replace(b"<cbc:ID>34</cbc:ID>", b"", 1)
    err = invalid(data, reg)
    [e] = err.errors
    assert e.path == "/Order/cbc:IssueDate"
    assert (e.line, e.column) == line_of(data, "<cbc:IssueDate>2010-01-20")
    assert "cbc:IssueDate" in e.message and "{urn:" not in e.message
    assert not reg._bundles  # xmlschema was never needed


def test_root_that_does_not_match_the_schema(registry: SchemaRegistry) -> None:
    assert not registry.is_valid(parse_document(ORDER), "ubl-2.1/Invoice")
    err = invalid(ORDER, registry, "ubl-2.1/Invoice")
    assert "Invoice" in err.detail and err.errors[0].path == "/Order"
    assert (err.errors[0].line, err.errors[0].column) == (2, 1)  # where the start tag begins


def test_root_with_no_schema(registry: SchemaRegistry) -> None:
    err = invalid(b"<Order xmlns='urn:example:not-ubl'/>", registry)
    assert "no schema" in err.detail.lower()
    assert err.errors[0].line == 1


def test_a_global_element_of_an_imported_schema_is_not_a_valid_order(registry: SchemaRegistry) -> None:
    """libxml2 would accept any global element of the imports (cbc:ID...) as a root."""
    data = f"<cbc:ID xmlns:cbc='{UBL_NAMESPACES['cbc']}'>1</cbc:ID>".encode()
    err = invalid(data, registry, "ubl-2.1/Order")
    assert "expects" in err.detail


def test_concurrent_validations_keep_their_own_errors(registry: SchemaRegistry) -> None:
    bad_a = parse_document(ORDER.replace(b'unitCode="LTR">120<', b'unitCode="LTR">aaa<'))
    bad_b = parse_document(ORDER.replace(b'unitCode="C62">15<', b'unitCode="C62">bbb<'))
    good = parse_document(ORDER)
    problems: list[str] = []

    def work(root: etree._Element, expected: str | None) -> None:
        for _ in range(20):
            try:
                registry.validate(root, "ubl-2.1/Order")
                if expected is not None:
                    problems.append("valid?")
            except SchemaValidationError as exc:
                if expected is None or len(exc.errors) != 1 or expected not in exc.errors[0].message:
                    problems.append(repr(exc))

    threads = [threading.Thread(target=work, args=args) for args in [(bad_a, "aaa"), (bad_b, "bbb"), (good, None)] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert problems == []


# --------------------------------------------------------------------------- local files only


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


IMPORTER = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:o="urn:o" targetNamespace="urn:a">
  <xs:import namespace="urn:o" schemaLocation="{location}"/>
  <xs:element name="a"><xs:complexType><xs:sequence><xs:element ref="o:o"/></xs:sequence></xs:complexType></xs:element>
</xs:schema>"""
IMPORTED = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:o">
  <xs:element name="o" type="xs:string"/>
</xs:schema>"""


def test_local_imports_inside_the_allowed_directory_work(tmp_path: Path) -> None:
    _write(tmp_path / "lib" / "o.xsd", IMPORTED)
    a = _write(tmp_path / "main" / "a.xsd", IMPORTER.format(location="../lib/o.xsd"))
    reg = SchemaRegistry([tmp_path])
    reg.register("a", a)
    reg.compile()
    reg.validate(etree.fromstring(b"<a xmlns='urn:a'><o xmlns='urn:o'>x</o></a>"))


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_imports_outside_the_allowed_directories_are_refused(tmp_path: Path, version: str) -> None:
    _write(tmp_path / "outside" / "o.xsd", IMPORTED)
    a = _write(tmp_path / "allowed" / "a.xsd", IMPORTER.format(location="../outside/o.xsd"))
    reg = SchemaRegistry([tmp_path / "allowed"])
    reg.register("a", a, version=version)
    with pytest.raises(ConfigError) as info:
        reg.compile()
    assert info.value.file == str(a.resolve())
    if version == "1.0":
        assert "refused" in info.value.detail and "o.xsd" in info.value.detail


def test_a_symlink_out_of_the_allowed_directory_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "outside" / "o.xsd", IMPORTED)
    (tmp_path / "allowed").mkdir()
    os.symlink(tmp_path / "outside" / "o.xsd", tmp_path / "allowed" / "o.xsd")
    a = _write(tmp_path / "allowed" / "a.xsd", IMPORTER.format(location="o.xsd"))
    reg = SchemaRegistry([tmp_path / "allowed"])
    reg.register("a", a)
    with pytest.raises(ConfigError):
        reg.compile(details=False)


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_imports_by_url_are_refused_without_a_connection(tmp_path: Path, version: str) -> None:
    with listening_socket() as (port, connections):
        a = _write(tmp_path / "a.xsd", IMPORTER.format(location=f"http://127.0.0.1:{port}/o.xsd"))
        reg = SchemaRegistry([tmp_path])
        reg.register("a", a, version=version)
        with pytest.raises(ConfigError):
            reg.compile()
        time.sleep(0.05)
        assert connections() == 0


@pytest.mark.parametrize("dtd", ["http://127.0.0.1:{port}/XMLSchema.dtd", "{outside}"])
def test_a_schema_with_an_external_dtd_loads_nothing_outside(
    tmp_path: Path, dtd: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = _write(tmp_path / "outside" / "XMLSchema.dtd", "<!ENTITY % p 'x'>")
    served: list[str] = []
    original = LocalSchemaResolver.resolve

    def recording(self, system_url, public_id, context):  # type: ignore[no-untyped-def]
        result = original(self, system_url, public_id, context)  # raises when refused
        served.append(system_url)
        return result

    monkeypatch.setattr(LocalSchemaResolver, "resolve", recording)
    with listening_socket() as (port, connections):
        location = dtd.format(port=port, outside=outside.as_uri())
        a = _write(tmp_path / "allowed" / "a.xsd", f'<!DOCTYPE xs:schema SYSTEM "{location}">\n' + IMPORTED)
        reg = SchemaRegistry([tmp_path / "allowed"])
        try:
            reg.register("a", a)
            reg.compile()
        except ConfigError as exc:  # lxml loads nothing; xmlschema (defuse="always") refuses it
            assert "refused" in exc.detail or "External references are forbidden" in exc.detail
        time.sleep(0.05)
        assert connections() == 0
    assert all("outside" not in url and "127.0.0.1" not in url for url in served)


def test_a_schema_file_outside_the_allowed_directories_cannot_be_registered(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.xsd", IMPORTED)
    reg = SchemaRegistry()  # only the vendored schemas
    with pytest.raises(ConfigError) as info:
        reg.register("a", a)
    assert "outside the allowed schema directories" in info.value.detail
    with pytest.raises(ConfigError):
        reg.register("b", tmp_path / "missing.xsd")


def test_instance_schema_location_hints_are_ignored(registry: SchemaRegistry) -> None:
    with listening_socket() as (port, connections):
        data = ORDER.replace(
            b'xmlns="urn:oasis:names:specification:ubl:schema:xsd:Order-2"',
            b'xmlns="urn:oasis:names:specification:ubl:schema:xsd:Order-2" '
            b'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            + f'xsi:schemaLocation="{ORDER_NS} http://127.0.0.1:{port}/Order.xsd"'.encode(),
        )
        bad = data.replace(b'unitCode="LTR">120<', b'unitCode="LTR">abc<')
        registry.validate(parse_document(data))
        invalid(bad, registry)  # the failure path (xmlschema) too
        time.sleep(0.05)
        assert connections() == 0


# --------------------------------------------------------------------------- XSD 1.1

RANGE_11 = """<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema" targetNamespace="urn:t" xmlns="urn:t"
    elementFormDefault="qualified" xpathDefaultNamespace="##targetNamespace">
  <xs:element name="Range">
    <xs:complexType>
      <xs:sequence>
        <xs:element name="Min" type="xs:int"/>
        <xs:element name="Max" type="xs:int"/>
      </xs:sequence>
      <xs:assert test="Min le Max"/>
    </xs:complexType>
  </xs:element>
</xs:schema>"""


def test_xsd_11_schema_validates_with_xmlschema(tmp_path: Path) -> None:
    xsd = _write(tmp_path / "range.xsd", RANGE_11)
    reg = SchemaRegistry([tmp_path])
    reg.register("range", xsd, version="1.1")
    assert set(reg.compile()) == {"xmlschema:range"}
    reg.validate(parse_document(b"<Range xmlns='urn:t'><Min>1</Min><Max>2</Max></Range>"))
    assert reg.is_valid(parse_document(b"<Range xmlns='urn:t'><Min>1</Min><Max>1</Max></Range>"))
    assert not reg.is_valid(parse_document(b"<Range xmlns='urn:t'><Min>2</Min><Max>1</Max></Range>"))
    data = b"<Range xmlns='urn:t'>\n  <Min>3</Min>\n  <Max>2</Max>\n</Range>"
    with pytest.raises(SchemaValidationError) as info:
        reg.validate(parse_document(data), "range", source=data)
    [e] = info.value.errors
    assert (e.line, e.column, e.path) == (1, 1, "/Range")
    assert "Min le Max" in e.message or "assert" in e.message.lower()
    with pytest.raises(SchemaValidationError) as info:
        reg.validate(parse_document(b"<Range xmlns='urn:t'><Min>x</Min><Max>2</Max></Range>"))
    assert "/Range/Min" in [e.path for e in info.value.errors]


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "path",
    [
        "/ord:Order/cbc:ID",
        "/ord:Order/cac:BuyerCustomerParty/cac:Party/cac:PartyName/cbc:Name",
        "cac:BuyerCustomerParty/cac:Party/cac:PartyName/cbc:Name",
        "/ord:Order/cac:OrderLine[1]/cac:LineItem/cbc:Quantity/@unitCode",
        "/ord:Order/cac:OrderLine[cbc:Note='a/b']/cac:LineItem/cbc:ID/text()",
        "cac:AnticipatedMonetaryTotal/cbc:PayableAmount/@currencyID",
        "ext:UBLExtensions/ext:UBLExtension/ext:ExtensionContent/sig:Anything/sig:Deeper",
        "cac:OrderLine/*/cbc:Whatever",
    ],
)
def test_paths_the_order_schema_declares(registry: SchemaRegistry, path: str) -> None:
    namespaces = {**NS, "sig": "urn:example:signatures"}
    assert registry.check_path("ubl-2.1/Order", path, namespaces) is None
    assert registry.element_exists("ubl-2.1/Order", path, namespaces)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/ord:Order/cbc:Idd", ["step 2", "'cbc:Idd'", "cbc:ID"]),
        ("/ord:Order/cac:BuyerCustomerParty/cac:Partyy/cbc:Name", ["step 3", "cac:Partyy", "cac:Party"]),
        ("cac:BuyerCustomerParty/cac:Party/cac:PartyName/cbc:Nome", ["step 4", "cbc:Nome", "cbc:Name"]),
        ("/Order/cbc:ID", ["step 1", "no namespace"]),
        ("/ord:Invoice/cbc:ID", ["step 1", "not the root"]),
        ("/ord:Order/cbc:ID/@bogus", ["step 3", "@bogus", "schemeID"]),
        ("/ord:Order/cbc:ID/cbc:ID", ["step 3", "has no child"]),
        ("/ord:Order/xx:ID", ["step 2", "unbound prefix"]),
        ("//cbc:ID", ["'//'"]),
        ("/ord:Order/../cbc:ID", ["'..'"]),
        ("/ord:Order/@x/cbc:ID", ["must be the last"]),
        ("/ord:Order/cbc:ID[", ["unbalanced"]),
        ("/ord:Order/cbc:ID]", ["unbalanced"]),
        ("/ord:Order/cbc:ID()", ["not a name step"]),
    ],
)
def test_paths_the_order_schema_does_not_declare(registry: SchemaRegistry, path: str, expected: list[str]) -> None:
    message = registry.check_path("ubl-2.1/Order", path, NS)
    assert message is not None
    for text in expected:
        assert text in message
    assert len(message) < 1000
    assert not registry.element_exists("ubl-2.1/Order", path, NS)


def test_check_path_of_an_unknown_schema(registry: SchemaRegistry) -> None:
    with pytest.raises(UnknownSchemaError):
        registry.check_path("ubl-2.1/Nope", "/x:y")


# --------------------------------------------------------------------------- element paths


def test_element_path_uses_document_prefixes_and_positions() -> None:
    root = parse_document(ORDER)
    quantity = root.findall("cac:OrderLine", NS)[1].find("cac:LineItem/cbc:Quantity", NS)
    assert element_path(quantity) == "/Order/cac:OrderLine[2]/cac:LineItem/cbc:Quantity"
    assert element_path(root) == "/Order"
    assert element_path(root.find("cbc:ID", NS)) == "/Order/cbc:ID"


# --------------------------------------------------------------------------- mutations

_ORDER_ELEMENTS = sum(1 for _ in parse_document(ORDER).iter(etree.Element)) - 1
_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=st.sampled_from(["delete", "duplicate", "text"]), index=st.integers(0, _ORDER_ELEMENTS - 1), text=_TEXT)
def test_mutations_of_the_order_validate_or_say_where(registry: SchemaRegistry, op: str, index: int, text: str) -> None:
    root = parse_document(ORDER)
    target = list(root.iter(etree.Element))[1 + index]
    if op == "delete":
        target.getparent().remove(target)
    elif op == "duplicate":
        target.addnext(copy.deepcopy(target))
    else:
        target.text = text
    data = etree.tostring(root, xml_declaration=True, encoding="UTF-8")
    try:
        registry.validate(parse_document(data), source=data)
    except SchemaValidationError as exc:
        assert exc.errors
        assert any(e.line is not None for e in exc.errors)
        for e in exc.errors:
            assert len(e.message) <= MAX_MESSAGE_CHARS
            if e.line is not None:
                assert 1 <= e.line <= data.count(b"\n") + 1
        assert len(json.dumps(exc.to_dict())) < 60_000
