"""Tests of gateway.routing.routes: matching, typed extraction, XSLT, and every load-time check
(XPaths compile and exist in the schema, destinations, shadowing) with file and line."""

from __future__ import annotations

import pytest
from gwtest import DESPATCH_ADVICE, INVOICE, ORDER, ORDER_CANCELLATION, REPO, SAMPLE_CONFIG
from lxml import etree

from gateway.config.loader import load_yaml, settings_from_mapping
from gateway.errors import ConfigError, ForbiddenRouteError, NoRouteError
from gateway.exchange.assemble import assemble
from gateway.intake.xmlsafe import parse_document
from gateway.routing.routes import RouteTable, TransformError

PARTNERS = REPO / "config" / "partners.yaml"
ORDER_ROOT = "{urn:oasis:names:specification:ubl:schema:xsd:Order-2}Order"


def table(tmp_path, registry, routes_yaml: str, **extra) -> tuple[RouteTable, list[ConfigError]]:
    (tmp_path / "routes.yaml").write_text(routes_yaml)
    data = load_yaml(text="partners: {}\n", name="main.yaml")
    data["partners"] = load_yaml(PARTNERS)["partners"]
    data["routes"] = load_yaml(tmp_path / "routes.yaml", name="routes.yaml")["routes"]
    data.update(extra)
    settings = settings_from_mapping(data, base_dir=tmp_path)
    assembly = assemble(settings, registry=registry)
    return assembly.routes, assembly.errors


def good(tmp_path, registry, routes_yaml: str, **extra) -> RouteTable:
    routes, errors = table(tmp_path, registry, routes_yaml, **extra)
    assert not errors, [str(e) for e in errors]
    return routes


def bad(tmp_path, registry, routes_yaml: str, **extra) -> list[ConfigError]:
    _, errors = table(tmp_path, registry, routes_yaml, **extra)
    assert errors
    return errors


@pytest.fixture
def sample(gw_registry):
    data = load_yaml(SAMPLE_CONFIG)
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG)
    assembly = assemble(settings, registry=gw_registry)
    assert not assembly.errors
    return assembly.routes


def test_sample_routes_select_by_root_and_partner(sample):
    order = parse_document(ORDER)
    assert sample.select(order, "acme").id == "ubl-order"
    with pytest.raises(ForbiddenRouteError):
        sample.select(order, "globex")
    assert sample.select(parse_document(INVOICE), "globex").id == "ubl-invoice"
    assert sample.select(parse_document(ORDER_CANCELLATION), "acme").id == "ubl-order-cancellation"
    quotation = etree.fromstring(b'<Quotation xmlns="urn:oasis:names:specification:ubl:schema:xsd:Quotation-2"/>')
    with pytest.raises(NoRouteError) as info:
        sample.select(quotation, "acme")
    assert "Quotation (urn:oasis:names:specification:ubl:schema:xsd:Quotation-2)" in info.value.detail
    assert "'acme'" in info.value.detail


def test_sample_routes_extract_typed_properties(sample):
    order = parse_document(ORDER)
    route = sample.get("ubl-order")
    assert route.request_reply and route.timeout == 10 and str(route.destination) == "queue://orders.inbound"
    assert route.extract(order) == {
        "OrderID": "34",
        "BuyerName": "Johnssons byggvaror",
        "SellerName": "Moderna Produkter AB",
        "Currency": "SEK",
        "TotalAmount": 6225.0,
    }
    assert route.extract_document_id(order) == "34"
    despatch = sample.get("ubl-despatch-advice")
    assert despatch.extract(parse_document(DESPATCH_ADVICE))["OrderID"] == "34"
    assert sample.get("ubl-invoice").time_to_live_ms == 30 * 86400 * 1000


def test_when_predicates_route_by_content(tmp_path, gw_registry):
    routes = good(
        tmp_path,
        gw_registry,
        f"""routes:
  - id: big-orders
    partners: [acme]
    root: "{ORDER_ROOT}"
    when: "number(cac:AnticipatedMonetaryTotal/cbc:PayableAmount) > 5000"
    destination: queue://orders.big
  - id: sek-orders
    partners: "*"
    root: "{ORDER_ROOT}"
    when: "cbc:DocumentCurrencyCode = 'SEK'"
    destination: queue://orders.sek
""",
    )
    order = parse_document(ORDER)
    assert routes.select(order, "acme").id == "big-orders"
    assert routes.select(order, "globex").id == "sek-orders"  # big-orders is acme's only
    small = parse_document(ORDER.replace(b'currencyID="SEK">6225<', b'currencyID="SEK">10<'))
    assert routes.select(small, "acme").id == "sek-orders"
    euro = parse_document(
        ORDER.replace(b">SEK</cbc:DocumentCurrencyCode>", b">EUR</cbc:DocumentCurrencyCode>").replace(
            b'currencyID="SEK">6225<', b'currencyID="SEK">10<'
        )
    )
    with pytest.raises(NoRouteError) as info:
        routes.select(euro, "acme")
    assert "conditions" in info.value.detail


def test_prefixed_root_and_default_schema(tmp_path, gw_registry):
    routes = good(
        tmp_path,
        gw_registry,
        """routes:
  - id: o
    partners: [acme]
    root: ord:Order
    destination: queue://o
""",
        namespaces={"ord": "urn:oasis:names:specification:ubl:schema:xsd:Order-2"},
    )
    assert routes.get("o").root == ORDER_ROOT and routes.get("o").schema == "ubl-2.1/Order"


def test_shadowed_routes_are_errors_with_the_later_line(tmp_path, gw_registry):
    errors = bad(
        tmp_path,
        gw_registry,
        f"""routes:
  - id: all-orders
    partners: [acme, globex]
    root: "{ORDER_ROOT}"
    destination: queue://a
  - id: acme-orders
    partners: [acme]
    root: "{ORDER_ROOT}"
    when: "cbc:ID = '1'"
    destination: queue://b
""",
    )
    [error] = errors
    assert error.file == "routes.yaml" and error.line == 6
    assert "'acme-orders' is shadowed by route 'all-orders' (routes.yaml:2)" in error.detail
    same_when = bad(
        tmp_path,
        gw_registry,
        f"""routes:
  - id: one
    partners: "*"
    root: "{ORDER_ROOT}"
    when: "cbc:ID = '1'"
    destination: queue://a
  - id: two
    partners: [acme]
    root: "{ORDER_ROOT}"
    when: "cbc:ID  =  '1'"
    destination: queue://b
""",
    )
    assert same_when[0].line == 7 and "same 'when'" in same_when[0].detail
    # disjoint partners, or a condition on the first: no shadow
    good(
        tmp_path,
        gw_registry,
        f"""routes:
  - id: one
    partners: [acme]
    root: "{ORDER_ROOT}"
    destination: queue://a
  - id: two
    partners: [globex]
    root: "{ORDER_ROOT}"
    destination: queue://b
  - id: three
    partners: [globex]
    root: "{{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}}Invoice"
    when: "cbc:ID = 'x'"
    destination: queue://c
  - id: four
    partners: [globex]
    root: "{{urn:oasis:names:specification:ubl:schema:xsd:Invoice-2}}Invoice"
    destination: queue://d
""",
    )


BASE = f"""routes:
  - id: r
    partners: [acme]
    root: "{ORDER_ROOT}"
    destination: queue://x
"""


@pytest.mark.parametrize(
    "extra, line, words",
    [
        ('    when: "cbc:ID = "\n', 6, "does not compile"),
        ("    properties:\n      Total: {xpath: 'cac:Nope/cbc:Amount', type: double}\n", 7, "does not exist"),
        ("    properties:\n      Total: {xpath: 'cbc:ID', type: decimal}\n", 7, "type must be one of"),
        ("    properties:\n      JMSPriority: cbc:ID\n", 7, "reserved"),
        ("    properties:\n      B2BRoute: cbc:ID\n", 7, "set by the gateway"),
        ("    properties:\n      ID: 'cbc:ID['\n", 7, "does not compile"),
        ("    document_id: cbc:NoSuchThing\n", 6, "does not exist"),
        ("    schema: ubl-2.1/Quotation\n", 6, "not configured"),
        ("    schema: ubl-2.1/Invoice\n", 4, "does not declare the root element"),
        ("    exchange: sometimes\n", 6, "one-way or request-reply"),
        ("    timeout: 5s\n", 6, "request-reply routes only"),
        ("    priority: 12\n", 6, "from 0 to 9"),
        ("    delivery_mode: maybe\n", 6, "persistent or non_persistent"),
        ("    time_to_live: forever\n", 6, "duration"),
        ("    colour: blue\n", 6, "unknown key"),
    ],
)
def test_route_errors_point_at_their_line(tmp_path, gw_registry, extra, line, words):
    errors = bad(tmp_path, gw_registry, BASE + extra)
    assert errors[0].file == "routes.yaml" and errors[0].line == line, str(errors[0])
    assert words in errors[0].detail


@pytest.mark.parametrize(
    "yaml_text, line, words",
    [
        (BASE.replace("queue://x", "temp-queue://x"), 5, "must be queue://NAME"),
        (BASE.replace("queue://x", "http://x"), 5, "invalid destination"),
        (BASE.replace("[acme]", "[initech]"), 3, "not configured"),
        (BASE.replace("[acme]", "[]"), 3, "allows no partner"),
        (BASE.replace(ORDER_ROOT, "{urn:x}Nothing"), 4, "no configured schema"),
        (BASE.replace(ORDER_ROOT, "zz:Order"), 4, "prefix 'zz'"),
        (BASE + "    exchange: request-reply\n".replace("queue", "topic"), None, None),
        (BASE.replace("queue://x", "topic://x") + "    exchange: request-reply\n", 5, "not a topic"),
        (BASE + BASE.split("routes:\n")[1], 6, "already used"),
    ],
)
def test_more_route_errors(tmp_path, gw_registry, yaml_text, line, words):
    routes, errors = table(tmp_path, gw_registry, yaml_text)
    if line is None:
        assert not errors
        return
    assert errors and errors[0].line == line and words in errors[0].detail, [str(e) for e in errors]


def test_all_errors_are_collected(tmp_path, gw_registry):
    errors = bad(
        tmp_path,
        gw_registry,
        BASE.replace("queue://x", "nope")
        + BASE.split("routes:\n")[1].replace("id: r", "id: s").replace("[acme]", "[initech]"),
    )
    assert [e.line for e in errors] == [5, 7]


def test_xslt_transform_is_compiled_once_and_applied(tmp_path, gw_registry):
    (
        tmp_path / "slim.xsl"
    ).write_text("""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform" exclude-result-prefixes="o cbc"
    xmlns:o="urn:oasis:names:specification:ubl:schema:xsd:Order-2"
    xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">
  <xsl:output method="xml" omit-xml-declaration="yes"/>
  <xsl:template match="/o:Order"><SlimOrder id="{cbc:ID}"/></xsl:template>
</xsl:stylesheet>""")
    routes = good(tmp_path, gw_registry, BASE + "    transform: slim.xsl\n")
    route = routes.get("r")
    assert route.apply_transform(parse_document(ORDER)).strip() == '<SlimOrder id="34"/>'


def test_xslt_may_not_read_files(tmp_path, gw_registry):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-IN-FILE")
    (
        tmp_path / "reads.xsl"
    ).write_text(f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:template match="/"><out><xsl:copy-of select="document('{secret.as_uri()}')"/></out></xsl:template>
</xsl:stylesheet>""")
    route = good(tmp_path, gw_registry, BASE + "    transform: reads.xsl\n").get("r")
    with pytest.raises(TransformError) as info:
        route.apply_transform(parse_document(ORDER))
    assert "SECRET" not in str(info.value) and info.value.status == 500
    (
        tmp_path / "includes.xsl"
    ).write_text(f"""<xsl:stylesheet version="1.0" xmlns:xsl="http://www.w3.org/1999/XSL/Transform">
  <xsl:include href="{(tmp_path / "reads.xsl").as_uri()}"/>
</xsl:stylesheet>""")
    errors = bad(tmp_path, gw_registry, BASE + "    transform: includes.xsl\n")
    assert errors[0].line == 6 and "transform" in errors[0].detail
    errors = bad(tmp_path, gw_registry, BASE + "    transform: missing.xsl\n")
    assert "cannot read" in errors[0].detail or "does not compile" in errors[0].detail


def test_a_partners_own_xsd_is_added_by_configuration(tmp_path):
    schemas = tmp_path / "schemas" / "acme"
    schemas.mkdir(parents=True)
    (schemas / "PriceList.xsd").write_text("""<xs:schema xmlns:xs="http://www.w3.org/2001/XMLSchema"
    targetNamespace="urn:acme:pricelist" xmlns="urn:acme:pricelist" elementFormDefault="qualified">
  <xs:element name="PriceList">
    <xs:complexType><xs:sequence>
      <xs:element name="ID" type="xs:string"/>
      <xs:element name="Item" maxOccurs="unbounded"><xs:complexType>
        <xs:attribute name="sku" type="xs:string" use="required"/>
        <xs:attribute name="price" type="xs:decimal" use="required"/>
      </xs:complexType></xs:element>
    </xs:sequence></xs:complexType>
  </xs:element>
</xs:schema>""")
    from gateway.intake.schemas import SchemaRegistry

    data = load_yaml(
        text="""
schemas:
  files:
    - {name: acme/PriceList, path: schemas/acme/PriceList.xsd}
namespaces: {pl: "urn:acme:pricelist"}
routes:
  - id: acme-prices
    partners: [acme]
    root: pl:PriceList
    document_id: pl:ID
    properties:
      Items: {xpath: "count(pl:Item)", type: long}
      FirstSku: pl:Item[1]/@sku
    destination: topic://prices
""",
        name="main.yaml",
    )
    data["partners"] = load_yaml(PARTNERS)["partners"]
    settings = settings_from_mapping(data, base_dir=tmp_path)
    assembly = assemble(settings)  # its own registry: only this schema
    assert not assembly.errors, [str(e) for e in assembly.errors]
    doc = parse_document(
        b'<PriceList xmlns="urn:acme:pricelist"><ID>P1</ID><Item sku="a" price="1.5"/>'
        b'<Item sku="b" price="2"/></PriceList>'
    )
    route = assembly.routes.select(doc, "acme")
    assembly.registry.validate(doc, route.schema)
    assert route.extract(doc) == {"Items": 2, "FirstSku": "a"}
    assert route.extract_document_id(doc) == "P1"
    assert isinstance(assembly.registry, SchemaRegistry) and assembly.registry.names == ["acme/PriceList"]
