"""Tests of the sample order responder: the OrderResponse it builds is valid
UBL 2.1 and references the order, for the official example and for generated
orders, directly and end to end through a broker (memory and SQLite)."""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from broker_core import Broker, Queue, Requestor, XMLMessage
from gateway.handlers import HandlerStats, Worker, registry
from gateway.intake.schemas import UBL_NAMESPACES, SchemaRegistry
from gateway.samples import order_responder
from gateway.samples.order_responder import ORDER_NS, ORDER_RESPONSE_NS, build_order_response

UBL_EXAMPLES = Path(__file__).resolve().parents[3].parent / "shared" / "ubl-2.1" / "xml"
ORDER_EXAMPLE = UBL_EXAMPLES / "UBL-Order-2.1-Example.xml"
ORDER_RESPONSE_EXAMPLE = UBL_EXAMPLES / "UBL-OrderResponse-2.1-Example.xml"
CAC = UBL_NAMESPACES["cac"]
CBC = UBL_NAMESPACES["cbc"]
NS = {"cac": CAC, "cbc": CBC, "or": ORDER_RESPONSE_NS, "o": ORDER_NS}
ORDER_RESPONSE = f"{{{ORDER_RESPONSE_NS}}}OrderResponse"

pytestmark = pytest.mark.filterwarnings("ignore::xmlschema.XMLSchemaImportWarning")


@pytest.fixture(scope="module")
def schemas() -> SchemaRegistry:
    reg = SchemaRegistry.ubl21(["Order", "OrderResponse"])
    reg.compile(details=False)
    return reg


def example_order() -> etree._Element:
    return etree.fromstring(ORDER_EXAMPLE.read_bytes())


def roundtrip(root: etree._Element) -> etree._Element:
    """Serialize and parse again, as a reply travels."""
    return etree.fromstring(etree.tostring(root, encoding="UTF-8", xml_declaration=True))


def check_response(response: etree._Element, order: etree._Element, schemas: SchemaRegistry) -> None:
    """What every response must be, whatever the order."""
    schemas.validate(response, "ubl-2.1/OrderResponse")
    response = roundtrip(response)  # still valid once serialized
    schemas.validate(response, "ubl-2.1/OrderResponse")
    assert response.tag == ORDER_RESPONSE
    order_id = order.findtext("cbc:ID", namespaces=NS)
    assert response.findtext("cbc:ID", namespaces=NS) == "OR-" + order_id.strip(" \t\r\n")
    assert response.findtext("cac:OrderReference/cbc:ID", namespaces=NS) == order_id
    for name in ("UUID", "IssueDate", "IssueTime"):
        assert response.findtext(f"cac:OrderReference/cbc:{name}", namespaces=NS) == order.findtext(
            f"cbc:{name}", namespaces=NS
        )
    assert response.findtext("cbc:DocumentCurrencyCode", namespaces=NS) == order.findtext(
        "cbc:DocumentCurrencyCode", namespaces=NS
    )
    for party in ("SellerSupplierParty", "BuyerCustomerParty"):
        names = [n.text for n in response.iterfind(f"cac:{party}/cac:Party/cac:PartyName/cbc:Name", NS)]
        assert names == [n.text for n in order.iterfind(f"cac:{party}/cac:Party/cac:PartyName/cbc:Name", NS)]
    ordered = [
        (
            line.findtext("cac:LineItem/cbc:ID", namespaces=NS),
            line.findtext("cac:LineItem/cbc:Quantity", namespaces=NS),
            line.findtext("cac:LineItem/cac:Item/cbc:Name", namespaces=NS),
        )
        for line in order.iterfind("cac:OrderLine", NS)
    ]
    answered = [
        (
            line.findtext("cac:LineItem/cbc:ID", namespaces=NS),
            line.findtext("cac:LineItem/cbc:Quantity", namespaces=NS),
            line.findtext("cac:LineItem/cac:Item/cbc:Name", namespaces=NS),
        )
        for line in response.iterfind("cac:OrderLine", NS)
    ]
    assert answered == ordered
    assert [
        line.findtext("cac:OrderLineReference/cbc:LineID", namespaces=NS)
        for line in response.iterfind("cac:OrderLine", NS)
    ] == [line_id for line_id, _, _ in ordered]
    assert {s.text for s in response.iterfind("cac:OrderLine/cac:LineItem/cbc:LineStatusCode", NS)} <= {"5"}


# --------------------------------------------------------------------------- the official example


def test_official_examples_are_valid(schemas):
    schemas.validate(example_order(), "ubl-2.1/Order")
    schemas.validate(etree.fromstring(ORDER_RESPONSE_EXAMPLE.read_bytes()), "ubl-2.1/OrderResponse")


def test_response_to_the_official_order(schemas):
    order = example_order()
    issued = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    response = build_order_response(order, issued=issued)
    check_response(response, order, schemas)

    get = lambda path: response.findtext(path, namespaces=NS)
    assert get("cbc:ID") == "OR-34"
    assert get("cbc:IssueDate") == "2024-05-06" and get("cbc:IssueTime") == "05:08:09Z"  # in UTC
    assert get("cbc:OrderResponseCode") == "AP"
    assert get("cbc:DocumentCurrencyCode") == "SEK"
    assert get("cac:OrderReference/cbc:ID") == "34"
    assert get("cac:OrderReference/cbc:IssueDate") == "2010-01-20"
    assert get("cac:SellerSupplierParty/cac:Party/cac:PartyName/cbc:Name") == "Moderna Produkter AB"
    assert get("cac:BuyerCustomerParty/cac:Party/cac:PartyName/cbc:Name") == "Johnssons byggvaror"
    # the schema's order: the seller comes before the buyer (the Order has them the other way round)
    tags = [etree.QName(child).localname for child in response]
    assert tags.index("SellerSupplierParty") < tags.index("BuyerCustomerParty")
    assert tags.index("OrderReference") < tags.index("SellerSupplierParty")
    lines = response.findall("cac:OrderLine", NS)
    assert len(lines) == 2
    quantity = lines[0].find("cac:LineItem/cbc:Quantity", NS)
    assert (quantity.text, quantity.get("unitCode")) == ("120", "LTR")
    assert lines[1].findtext("cac:LineItem/cac:Item/cbc:Name", namespaces=NS) == "Pensel 20 mm"
    assert lines[1].findtext("cac:LineItem/cac:Price/cbc:PriceAmount", namespaces=NS) == "15"


def test_response_id_can_be_chosen_and_the_order_is_not_changed(schemas):
    order = example_order()
    before = etree.tostring(order)
    response = build_order_response(order, response_id="RESP-1")
    assert response.findtext("cbc:ID", namespaces=NS) == "RESP-1"
    assert etree.tostring(order) == before  # parts are copied, not moved
    schemas.validate(response, "ubl-2.1/OrderResponse")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.remove(o.find("cbc:ID", NS)), "no cbc:ID"),
        (lambda o: o.remove(o.find("cac:SellerSupplierParty", NS)), "SellerSupplierParty"),
        (lambda o: o.find("cac:OrderLine", NS).remove(o.find("cac:OrderLine/cac:LineItem", NS)), "order line 1"),
    ],
)
def test_unanswerable_orders_raise(mutate, message):
    order = example_order()
    mutate(order)
    with pytest.raises(ValueError, match=message):
        build_order_response(order)


def test_only_orders_are_answered():
    with pytest.raises(ValueError, match="expected a UBL 2.1 Order"):
        build_order_response(etree.fromstring(ORDER_RESPONSE_EXAMPLE.read_bytes()))


# --------------------------------------------------------------------------- generated orders

XML_TEXT = st.characters(blacklist_categories=("Cs", "Cc", "Cn"))
SPECIAL = st.sampled_from(list("<>&\"'") + ["&amp;", "]]>", "<!--", "&#x41;"])
NAME = st.lists(st.one_of(SPECIAL, XML_TEXT), min_size=1, max_size=12).map("".join)
QUANTITY = st.decimals(
    min_value=Decimal("0.001"), max_value=Decimal("1000000"), places=3, allow_nan=False, allow_infinity=False
)
LINE = st.tuples(QUANTITY, st.sampled_from(["C62", "LTR", "KGM", "EA"]), NAME)


def make_order(
    order_id: str,
    buyer: str,
    seller: str,
    lines: list[tuple[Decimal, str, str]],
    currency: str | None,
    uuid: str | None,
    issue_time: bool,
) -> etree._Element:
    """A UBL 2.1 Order built with lxml (every text escaped by lxml)."""

    def sub(parent, ns, name, text=None, **attrib):
        element = etree.SubElement(parent, f"{{{ns}}}{name}", attrib)
        if text is not None:
            element.text = text
        return element

    def party(parent, role, name):
        holder = sub(parent, CAC, role)
        p = sub(holder, CAC, "Party")
        sub(sub(p, CAC, "PartyName"), CBC, "Name", name)

    order = etree.Element(f"{{{ORDER_NS}}}Order", nsmap={None: ORDER_NS, "cac": CAC, "cbc": CBC})
    sub(order, CBC, "UBLVersionID", "2.1")
    sub(order, CBC, "ID", order_id)
    if uuid is not None:
        sub(order, CBC, "UUID", uuid)
    sub(order, CBC, "IssueDate", "2024-02-29")
    if issue_time:
        sub(order, CBC, "IssueTime", "23:59:59")
    if currency is not None:
        sub(order, CBC, "DocumentCurrencyCode", currency)
    party(order, "BuyerCustomerParty", buyer)
    party(order, "SellerSupplierParty", seller)
    for n, (quantity, unit, item_name) in enumerate(lines, start=1):
        line_item = sub(sub(order, CAC, "OrderLine"), CAC, "LineItem")
        sub(line_item, CBC, "ID", str(n))
        sub(line_item, CBC, "Quantity", format(quantity, "f"), unitCode=unit)
        sub(sub(line_item, CAC, "Item"), CBC, "Name", item_name)
    return order


ORDERS = st.builds(
    make_order,
    order_id=st.text(XML_TEXT, min_size=1, max_size=40),
    buyer=NAME,
    seller=NAME,
    lines=st.lists(LINE, min_size=1, max_size=20),
    currency=st.sampled_from([None, "EUR", "SEK", "USD"]),
    uuid=st.one_of(st.none(), st.uuids().map(str)),
    issue_time=st.booleans(),
)


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=ORDERS)
def test_response_to_generated_orders_is_valid(order, schemas):
    order = roundtrip(order)
    schemas.validate(order, "ubl-2.1/Order")  # the generator makes valid orders
    check_response(build_order_response(order), order, schemas)


# --------------------------------------------------------------------------- through a broker


@pytest.fixture(params=["memory", "sqlite"])
def open_broker(request, tmp_path):
    opened: list[Broker] = []

    def open_(**options) -> Broker:
        url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/b.db"
        broker = Broker.open(url, sweep_interval=0, **options)
        opened.append(broker)
        return broker

    yield open_
    for broker in reversed(opened):
        broker.close()


def test_importing_registers_the_handler():
    respond = order_responder.respond
    assert registry.get("order_responder") is respond
    assert respond.destination == Queue("orders.inbound")
    assert respond.selector is None and respond.prefetch == 1  # every message of the queue, one at a time


def test_the_answer_is_logged_at_debug_only(caplog):
    """One line per order would be hundreds a second under load: the serving log at INFO stays quiet."""
    import logging

    from broker_core import XMLMessage
    from gateway.samples.order_responder import respond

    logger = logging.getLogger("test.order_responder")

    class Context:
        pass

    context = Context()
    context.logger = logger
    order = XMLMessage(ORDER_EXAMPLE.read_text(encoding="utf-8"))
    with caplog.at_level(logging.INFO, logger=logger.name):
        respond(order, context)
    assert not caplog.records
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        respond(order, context)
    assert [r.getMessage() for r in caplog.records] == ["order 34 answered with order response OR-34"]


def test_end_to_end_with_a_requestor(open_broker, schemas):
    broker = open_broker()
    generated = make_order(
        ' PO <&> "42" ',
        "Buyer & <Sons>",
        "Seller 'Ltd' ]]>",
        [(Decimal(n) / 4, "KGM", f"Item <{n}> & co") for n in range(1, 8)],
        "EUR",
        "0b5c7f0e-3f1a-4d43-9a59-2f5d0c3b6a11",
        True,
    )
    orders = [example_order(), generated]
    with Worker(broker, [order_responder.respond]) as worker, broker.connect() as conn:
        conn.start()
        requestor = Requestor(conn.create_session(), Queue("orders.inbound"))
        for order in orders:
            request = XMLMessage(etree.tostring(order, encoding="unicode"))
            request.jms_type = "Order"
            reply = requestor.request(request, timeout=10)
            assert reply.jms_correlation_id == request.jms_message_id
            assert reply.jms_type == "OrderResponse"
            response = reply.document()
            check_response(response, order, schemas)
        deadline = time.monotonic() + 5  # counted once the commit returns, maybe just after the reply arrived
        while worker.stats()["order_responder"].handled < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.stats()["order_responder"] == HandlerStats(handled=2, replied=2, failed=0)


def test_messages_that_are_not_answerable_orders_are_dead_lettered(open_broker):
    broker = open_broker(max_deliveries=2)
    inbound = Queue("orders.inbound")
    bodies = {
        "malformed": "<Order xmlns='urn:oasis:names:specification:ubl:schema:xsd:Order-2'>",
        "not an order": ORDER_RESPONSE_EXAMPLE.read_text(encoding="utf-8"),
    }
    ids = {}
    with broker.connect() as conn:
        producer = conn.create_session().create_producer(inbound)
        for what, body in bodies.items():
            message = XMLMessage(body)
            message.jms_type = "Order"
            message.jms_reply_to = Queue("replies")
            producer.send(message)
            ids[what] = message.jms_message_id
        other = XMLMessage(etree.tostring(example_order(), encoding="unicode"))
        other.jms_type = "Invoice"  # an order's body, but not typed as an Order: refused all the same
        other.jms_reply_to = Queue("replies")
        producer.send(other)
        ids["typed as another document"] = other.jms_message_id
    with Worker(broker, [order_responder.respond]) as worker:
        deadline = time.monotonic() + 10
        while set(broker.message_status(list(ids.values())).values()) != {"dead_lettered"}:
            assert time.monotonic() < deadline, broker.message_status(list(ids.values()))
            time.sleep(0.02)
    assert worker.stats()["order_responder"] == HandlerStats(handled=0, replied=0, failed=6)
    assert list(broker.browse(Queue("replies"))) == []
