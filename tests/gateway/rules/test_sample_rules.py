"""The sample business rules (rules/ubl-order.sch) on UBL 2.1 Orders.

The amount rules follow UBL 2.1's definitions: a line's amount is its quantity times its price per base
quantity, plus the line's charges, minus its allowances (net of tax); in the order's
cac:AnticipatedMonetaryTotal, the line extension amount is the sum of the line amounts, the tax-exclusive
amount is that minus the allowance total plus the charge total, the tax-inclusive amount is that plus the
tax of cac:TaxTotal, and the payable amount is the tax-inclusive amount (or, when the order states none,
the tax-exclusive total, with or without its tax) minus the prepaid amount plus the rounding amount.
Amounts computed from others may be rounded to the currency at each step: they are compared with a slack
of one unit of the currency's minor unit (0.01 EUR, 1 JPY, 0.001 KWD).

Orders are generated with amounts computed that way (decimal quantities and prices, base quantities, tax
rates, allowances and charges on the lines and the order, prepaid and rounding amounts, currencies of two,
zero and three decimals, amounts rounded up, down or to the nearest) and must pass; each kind of
inconsistency, one amount wrong by more than the slack and everything else computed from it, must be
refused by its rule and by no other. The generated orders are valid UBL 2.1 Orders (checked against the
schema), and the rules run as the gateway runs them: compiled by ``load_schematron``, run by
``SaxonRules`` on the document's text.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_FLOOR, ROUND_HALF_EVEN, ROUND_HALF_UP, ROUND_UP, Decimal
from pathlib import Path

import pytest
from gwtest import FIXTURES, REPO, UBL_EXAMPLES
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from lxml import etree

from gateway.rules.schematron import SaxonRules, document_text, load_schematron

RULES_FILE = REPO / "rules" / "ubl-order.sch"
ORDER_NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
CAC = "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"
CBC = "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"
NSMAP = {None: ORDER_NS, "cac": CAC, "cbc": CBC}

#: Currencies and their ISO 4217 minor unit (the decimals of their amounts).
CURRENCIES = {"EUR": 2, "SEK": 2, "USD": 2, "JPY": 0, "KRW": 0, "ISK": 0, "KWD": 3}
UNITS = ["C62", "EA", "KGM", "LTR", "MTR", "HUR"]
ROUNDINGS = [ROUND_HALF_UP, ROUND_HALF_EVEN, ROUND_DOWN, ROUND_UP, ROUND_FLOOR, ROUND_CEILING]
# Two GLNs with valid GS1 check digits: the parties raise no PTY-02 warning.
BUYER_GLN, SELLER_GLN = "7300070011115", "5790000436101"


@pytest.fixture(scope="module")
def sample_rules() -> SaxonRules:
    rules = SaxonRules()
    rules.add(load_schematron(RULES_FILE))
    return rules


def findings(rules: SaxonRules, document: bytes | etree._Element) -> list:
    root = document if isinstance(document, etree._Element) else etree.fromstring(document)
    return rules.run(document_text(root))


def refusals(rules: SaxonRules, document: bytes | etree._Element) -> list[str]:
    """The ids of the findings that refuse the document (flag fatal), in the order of the rules."""
    return [f.assertion.id for f in findings(rules, document) if f.is_error]


# --------------------------------------------------------------------------- the model of an order


@dataclass
class Line:
    quantity: Decimal
    unit: str
    price: Decimal
    base: Decimal | None  # cac:Price/cbc:BaseQuantity
    allowances: list[Decimal]
    charges: list[Decimal]
    rate: Decimal
    amount: Decimal  # cbc:LineExtensionAmount as stated


@dataclass
class Order:
    currency: str
    state_currency_code: bool
    indicator_spelling: tuple[str, str]  # cbc:ChargeIndicator of a charge and of an allowance
    lines: list[Line]
    allowances: list[tuple[Decimal, Decimal]]  # (amount, tax rate)
    charges: list[tuple[Decimal, Decimal]]
    state_allowance_total: bool
    state_charge_total: bool
    state_tax_exclusive: bool
    tax: str  # "none", "total" (cbc:TaxAmount only) or "subtotals" (by rate)
    tax_rounding_step: Decimal | None  # cac:TaxTotal/cbc:RoundingAmount rounds the tax to this step
    state_tax_inclusive: bool
    payable_with_tax: bool  # without a tax-inclusive amount: the payable amount includes the tax
    prepaid_percent: int | None
    payable_rounding_step: Decimal | None
    rounding: str  # how the computed amounts are rounded to the currency
    #: amounts stated wrong by this much (cbc: names of the monetary total, or "TaxAmount")
    wrong: dict[str, Decimal] = field(default_factory=dict)

    @property
    def unit(self) -> Decimal:
        return Decimal(1).scaleb(-CURRENCIES[self.currency])

    def money(self, value: Decimal, rounding: str | None = None) -> Decimal:
        return value.quantize(self.unit, rounding=rounding or self.rounding)


@dataclass
class Totals:
    line_extension: Decimal
    allowance_total: Decimal
    charge_total: Decimal
    tax_exclusive: Decimal
    subtotals: list[tuple[Decimal, Decimal, Decimal]]  # (rate, taxable amount, tax amount)
    tax_rounding: Decimal | None
    tax: Decimal
    tax_inclusive: Decimal
    prepaid: Decimal | None
    payable_rounding: Decimal | None
    payable: Decimal
    payable_alternatives: list[Decimal]  # other payable amounts the rules accept (see TOT-04)


def exact_line_amount(line: Line) -> Decimal:
    """UBL 2.1: quantity x price / base quantity, plus the line's charges, minus its allowances."""
    return line.quantity * line.price / (line.base or 1) + sum(line.charges) - sum(line.allowances)


def step_round(value: Decimal, step: Decimal) -> Decimal:
    return (value / step).quantize(Decimal(1), rounding=ROUND_HALF_UP) * step


def totals(order: Order) -> Totals:
    """The order's monetary totals, each computed from the ones before as stated (a wrong one included)."""
    wrong = order.wrong
    line_extension = sum((line.amount for line in order.lines), Decimal(0)) + wrong.get("LineExtensionAmount", 0)
    allowance_total = sum((a for a, _ in order.allowances), Decimal(0)) + wrong.get("AllowanceTotalAmount", 0)
    charge_total = sum((c for c, _ in order.charges), Decimal(0)) + wrong.get("ChargeTotalAmount", 0)
    tax_exclusive = line_extension - allowance_total + charge_total + wrong.get("TaxExclusiveAmount", 0)
    taxable: dict[Decimal, Decimal] = {}
    for line in order.lines:
        taxable[line.rate] = taxable.get(line.rate, Decimal(0)) + line.amount
    for amount, rate in order.allowances:
        taxable[rate] = taxable.get(rate, Decimal(0)) - amount
    for amount, rate in order.charges:
        taxable[rate] = taxable.get(rate, Decimal(0)) + amount
    subtotals = [(rate, base, order.money(base * rate / 100)) for rate, base in sorted(taxable.items())]
    computed_tax = sum((t for _, _, t in subtotals), Decimal(0))
    tax_rounding = None
    if order.tax_rounding_step is not None:
        tax_rounding = step_round(computed_tax, order.tax_rounding_step) - computed_tax
        computed_tax += tax_rounding
    tax = computed_tax + wrong.get("TaxAmount", 0) if order.tax != "none" else Decimal(0)
    tax_inclusive = tax_exclusive + tax + wrong.get("TaxInclusiveAmount", 0)
    with_tax = order.state_tax_inclusive or (order.tax != "none" and order.payable_with_tax)
    before_payment = tax_inclusive if with_tax else tax_exclusive
    prepaid = None
    if order.prepaid_percent is not None:
        prepaid = order.money(max(before_payment, Decimal(0)) * order.prepaid_percent / 100, ROUND_DOWN)
    unrounded = before_payment - (prepaid or 0)
    payable_rounding = None
    if order.payable_rounding_step is not None:
        payable_rounding = step_round(unrounded, order.payable_rounding_step) - unrounded
    payable = unrounded + (payable_rounding or 0) + wrong.get("PayableAmount", 0)
    alternatives = []
    if not order.state_tax_inclusive and order.tax != "none":
        # without a tax-inclusive amount, the payable amount may or may not include the order's tax
        alternatives.append(payable - tax if with_tax else payable + tax)
    return Totals(
        line_extension,
        allowance_total,
        charge_total,
        tax_exclusive,
        subtotals,
        tax_rounding,
        tax,
        tax_inclusive,
        prepaid,
        payable_rounding,
        payable,
        alternatives,
    )


# --------------------------------------------------------------------------- the order as UBL 2.1 XML


def _el(parent: etree._Element, ns: str, name: str, text: object = None, **attrs: str) -> etree._Element:
    el = etree.SubElement(parent, f"{{{ns}}}{name}", attrs)
    if text is not None:
        el.text = text if isinstance(text, str) else format(text, "f")
    return el


def _tax_category(parent: etree._Element, name: str, rate: Decimal) -> None:
    category = _el(parent, CAC, name)
    _el(category, CBC, "ID", "S" if rate else "Z")
    _el(category, CBC, "Percent", rate)
    _el(_el(category, CAC, "TaxScheme"), CBC, "ID", "VAT")


def _allowance_charge(
    parent: etree._Element, order: Order, charge: bool, amount: Decimal, rate: Decimal | None
) -> None:
    ac = _el(parent, CAC, "AllowanceCharge")
    _el(ac, CBC, "ChargeIndicator", order.indicator_spelling[0 if charge else 1])
    _el(ac, CBC, "AllowanceChargeReason", "Freight" if charge else "Discount")
    _el(ac, CBC, "Amount", amount, currencyID=order.currency)
    if rate is not None:
        _tax_category(ac, "TaxCategory", rate)


def _party(parent: etree._Element, role: str, gln: str, name: str) -> None:
    party = _el(_el(parent, CAC, role), CAC, "Party")
    _el(party, CBC, "EndpointID", gln, schemeID="0088")
    _el(_el(party, CAC, "PartyName"), CBC, "Name", name)


def order_xml(order: Order) -> etree._Element:
    t = totals(order)
    money = {"currencyID": order.currency}
    taxed = order.tax != "none"
    root = etree.Element(f"{{{ORDER_NS}}}Order", nsmap=NSMAP)
    _el(root, CBC, "UBLVersionID", "2.1")
    _el(root, CBC, "ID", "PO-1")
    _el(root, CBC, "IssueDate", "2026-01-15")
    if order.state_currency_code:
        _el(root, CBC, "DocumentCurrencyCode", order.currency)
    _party(root, "BuyerCustomerParty", BUYER_GLN, "Buyer AB")
    _party(root, "SellerSupplierParty", SELLER_GLN, "Seller AB")
    for amount, rate in order.charges:
        _allowance_charge(root, order, True, amount, rate if taxed else None)
    for amount, rate in order.allowances:
        _allowance_charge(root, order, False, amount, rate if taxed else None)
    if taxed:
        tax_total = _el(root, CAC, "TaxTotal")
        _el(tax_total, CBC, "TaxAmount", t.tax, **money)
        if order.tax == "subtotals":
            if t.tax_rounding is not None:
                _el(tax_total, CBC, "RoundingAmount", t.tax_rounding, **money)
            for rate, taxable, tax in t.subtotals:
                subtotal = _el(tax_total, CAC, "TaxSubtotal")
                _el(subtotal, CBC, "TaxableAmount", taxable, **money)
                _el(subtotal, CBC, "TaxAmount", tax, **money)
                _tax_category(subtotal, "TaxCategory", rate)
    total = _el(root, CAC, "AnticipatedMonetaryTotal")
    _el(total, CBC, "LineExtensionAmount", t.line_extension, **money)
    if order.state_tax_exclusive:
        _el(total, CBC, "TaxExclusiveAmount", t.tax_exclusive, **money)
    if order.state_tax_inclusive:
        _el(total, CBC, "TaxInclusiveAmount", t.tax_inclusive, **money)
    if order.state_allowance_total:
        _el(total, CBC, "AllowanceTotalAmount", t.allowance_total, **money)
    if order.state_charge_total:
        _el(total, CBC, "ChargeTotalAmount", t.charge_total, **money)
    if t.prepaid is not None:
        _el(total, CBC, "PrepaidAmount", t.prepaid, **money)
    if t.payable_rounding is not None:
        _el(total, CBC, "PayableRoundingAmount", t.payable_rounding, **money)
    _el(total, CBC, "PayableAmount", t.payable, **money)
    for number, line in enumerate(order.lines, 1):
        item = _el(_el(root, CAC, "OrderLine"), CAC, "LineItem")
        _el(item, CBC, "ID", str(number))
        _el(item, CBC, "Quantity", line.quantity, unitCode=line.unit)
        _el(item, CBC, "LineExtensionAmount", line.amount, **money)
        for amount in line.charges:
            _allowance_charge(item, order, True, amount, None)
        for amount in line.allowances:
            _allowance_charge(item, order, False, amount, None)
        price = _el(item, CAC, "Price")
        _el(price, CBC, "PriceAmount", line.price, **money)
        if line.base is not None:
            _el(price, CBC, "BaseQuantity", line.base, unitCode=line.unit)
        article = _el(item, CAC, "Item")
        _el(article, CBC, "Name", f"Article {number}")
        if taxed:
            _tax_category(article, "ClassifiedTaxCategory", line.rate)
    return root


# --------------------------------------------------------------------------- generated orders

RATES = [Decimal(r) for r in ("0", "5", "7.5", "12", "19", "25")]


def decimals(low: int, high: int, places: int) -> st.SearchStrategy[Decimal]:
    """Decimals of low..high with at most *places* decimals (some with fewer)."""
    return st.integers(0, places).flatmap(
        lambda p: st.integers(low * 10**p, high * 10**p).map(lambda n: Decimal(n).scaleb(-p))
    )


@st.composite
def lines(draw, currency: str, rounding: str, rates: list[Decimal], index: int) -> Line:
    unit = Decimal(1).scaleb(-CURRENCIES[currency])
    quantity = draw(decimals(1, 500, 3))
    price = draw(decimals(1, 2000, 4)) if CURRENCIES[currency] else draw(decimals(1, 200000, 2))
    base = draw(st.sampled_from([None, Decimal(1), Decimal(10), Decimal(12), Decimal("2.5")]))
    gross = quantity * price / (base or 1)
    allowances = [
        (gross * p / 100).quantize(unit, rounding=ROUND_DOWN) for p in draw(st.lists(st.integers(0, 20), max_size=2))
    ]
    charges = [n * unit for n in draw(st.lists(st.integers(0, 5000), max_size=2))]
    line = Line(
        quantity, UNITS[index % len(UNITS)], price, base, allowances, charges, draw(st.sampled_from(rates)), Decimal(0)
    )
    line.amount = exact_line_amount(line).quantize(unit, rounding=rounding)
    return line


@st.composite
def orders(
    draw,
    *,
    allowance_total: bool | None = None,
    charge_total: bool | None = None,
    tax_exclusive: bool | None = None,
    tax: str | None = None,
    tax_inclusive: bool | None = None,
    line_charges: bool = False,
) -> Order:
    """Consistent orders; the keywords force a choice (for the inconsistencies that need it)."""
    currency = draw(st.sampled_from(sorted(CURRENCIES)))
    unit = Decimal(1).scaleb(-CURRENCIES[currency])
    rounding = draw(st.sampled_from(ROUNDINGS))
    rates = draw(st.lists(st.sampled_from(RATES), min_size=1, max_size=3, unique=True))
    count = draw(st.integers(1, 6))
    order_lines = [draw(lines(currency, rounding, rates, i)) for i in range(count)]
    if line_charges:
        assume(any(line.charges or line.allowances for line in order_lines))
    line_total = sum(line.amount for line in order_lines)
    allowances = [
        ((line_total * p / 100).quantize(unit, rounding=ROUND_DOWN), draw(st.sampled_from(rates)))
        for p in draw(st.lists(st.integers(0, 10), max_size=3))
    ]
    charges = [(n * unit, draw(st.sampled_from(rates))) for n in draw(st.lists(st.integers(0, 10000), max_size=3))]
    tax_mode = tax or draw(st.sampled_from(["none", "total", "subtotals"]))
    rounding_steps = [unit * 5, unit * 10, unit * 100]
    return Order(
        currency=currency,
        state_currency_code=draw(st.booleans()),
        indicator_spelling=draw(st.sampled_from([("true", "false"), ("1", "0")])),
        lines=order_lines,
        allowances=allowances,
        charges=charges,
        state_allowance_total=draw(st.booleans()) if allowance_total is None else allowance_total,
        state_charge_total=draw(st.booleans()) if charge_total is None else charge_total,
        state_tax_exclusive=draw(st.booleans()) if tax_exclusive is None else tax_exclusive,
        tax=tax_mode,
        tax_rounding_step=draw(st.none() | st.sampled_from(rounding_steps)) if tax_mode == "subtotals" else None,
        state_tax_inclusive=draw(st.booleans()) if tax_inclusive is None else tax_inclusive,
        payable_with_tax=draw(st.booleans()),
        prepaid_percent=draw(st.none() | st.integers(0, 100)),
        payable_rounding_step=draw(st.none() | st.sampled_from(rounding_steps)),
        rounding=rounding,
    )


@pytest.fixture(scope="module")
def order_schema(gw_registry):
    """Checks that a generated order is a valid UBL 2.1 Order."""

    def check(root: etree._Element) -> None:
        gw_registry.validate(root)

    return check


PROPERTY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


@PROPERTY
@given(order=orders())
def test_orders_with_consistent_amounts_pass(sample_rules, order_schema, order):
    event(f"currency {order.currency} ({CURRENCIES[order.currency]} decimals)")
    event(f"tax: {order.tax}, tax-inclusive amount stated: {order.state_tax_inclusive}")
    root = order_xml(order)
    order_schema(root)
    assert refusals(sample_rules, root) == []


# Each kind of inconsistency: the amount stated wrong (everything after it computed from the wrong value,
# so that only the rule of that amount is broken), what the order must have for it, and the rule.
INCONSISTENCIES = {
    "a line amount": ("line", {}, "LIN-06"),
    "a line's charges or allowances left out of its amount": ("line-charge", {"line_charges": True}, "LIN-06"),
    "the lines' total": ("LineExtensionAmount", {}, "TOT-01"),
    "the allowance total": ("AllowanceTotalAmount", {"allowance_total": True}, "TOT-02"),
    "the charge total": ("ChargeTotalAmount", {"charge_total": True}, "TOT-03"),
    "the tax-exclusive amount": ("TaxExclusiveAmount", {"tax_exclusive": True}, "TOT-05"),
    "the tax-inclusive amount": ("TaxInclusiveAmount", {"tax_inclusive": True, "tax": "total"}, "TOT-06"),
    "the payable amount": ("PayableAmount", {}, "TOT-04"),
    "the tax total against its subtotals": ("TaxAmount", {"tax": "subtotals"}, "TAX-01"),
}


@pytest.mark.parametrize("kind", sorted(INCONSISTENCIES))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_each_inconsistency_is_refused_by_its_rule(sample_rules, order_schema, kind, data):
    what, needs, rule = INCONSISTENCIES[kind]
    order = data.draw(orders(**needs), label="order")
    # wrong by 2 units of the currency or more: beyond the slack of 1 unit even where the right amount was
    # rounded (up or down) by almost a unit
    units = data.draw(st.integers(2, 100000), label="units") * data.draw(st.sampled_from([1, -1]), label="sign")
    delta = units * order.unit
    if what == "line":
        number = data.draw(st.integers(0, len(order.lines) - 1), label="line")
        order.lines[number] = replace(order.lines[number], amount=order.lines[number].amount + delta)
    elif what == "line-charge":
        number = data.draw(
            st.sampled_from([i for i, line in enumerate(order.lines) if line.charges or line.allowances]), label="line"
        )
        line = order.lines[number]
        # the amount stays that of the line's quantity and price, its charges and allowances forgotten
        forgotten = sum(line.charges) - sum(line.allowances)
        assume(abs(forgotten) >= 2 * order.unit)
        order.lines[number] = replace(line, amount=(line.amount - forgotten))
    else:
        order.wrong[what] = delta
        if what == "PayableAmount":
            right = replace(order, wrong={})
            for other in totals(right).payable_alternatives:  # the payable amount the rules also accept
                assume(abs(totals(order).payable - other) > order.unit)
    root = order_xml(order)
    order_schema(root)
    assert refusals(sample_rules, root) == [rule]


# --------------------------------------------------------------------------- documents


def _ubl_orders() -> list[Path]:
    found = []
    for path in sorted(UBL_EXAMPLES.glob("*.xml")):
        if etree.parse(str(path)).getroot().tag == f"{{{ORDER_NS}}}Order":
            found.append(path)
    return found


@pytest.mark.parametrize("path", _ubl_orders(), ids=lambda p: p.name)
def test_every_oasis_example_order_passes(sample_rules, path):
    found = findings(sample_rules, path.read_bytes())
    assert [f.assertion.id for f in found if f.is_error] == []
    # its only findings are the warnings about four GLNs whose check digits are wrong
    assert {(f.assertion.id, f.assertion.flag) for f in found} <= {("PTY-02", "warning")}


def test_the_oasis_examples_hold_an_order():
    assert [p.name for p in _ubl_orders()] == ["UBL-Order-2.1-Example.xml"]


TAX_ORDER = (FIXTURES / "UBL-Order-2.1-With-Tax.xml").read_bytes()


def _without(document: bytes, *elements: str) -> bytes:
    root = etree.fromstring(document)
    for name in elements:
        for el in list(root.iter(f"{{{CBC}}}{name}", f"{{{CAC}}}{name}")):
            el.getparent().remove(el)
    return etree.tostring(root)


def _amount(document: bytes, element: str, value: str) -> bytes:
    root = etree.fromstring(document)
    (el,) = root.findall(f"cac:AnticipatedMonetaryTotal/cbc:{element}", {"cac": CAC, "cbc": CBC})
    el.text = value
    return etree.tostring(root)


def test_an_order_with_tax_passes(sample_rules, order_schema):
    """Lines of 115.00 EUR, 25% VAT (28.75): tax-inclusive and payable 143.75, as in Peppol BIS 3's order
    example."""
    order_schema(etree.fromstring(TAX_ORDER))
    assert findings(sample_rules, TAX_ORDER) == []


def test_an_order_with_tax_and_a_prepaid_amount_passes(sample_rules):
    prepaid = TAX_ORDER.replace(
        b"<cbc:PayableAmount", b'<cbc:PrepaidAmount currencyID="EUR">43.75</cbc:PrepaidAmount><cbc:PayableAmount'
    )
    assert refusals(sample_rules, _amount(prepaid, "PayableAmount", "100.00")) == []
    assert refusals(sample_rules, prepaid) == ["TOT-04"]  # 143.75 is no longer what is due


def test_without_a_tax_inclusive_amount_the_payable_amount_may_include_the_tax_or_not(sample_rules):
    no_inclusive = _without(TAX_ORDER, "TaxInclusiveAmount")
    assert refusals(sample_rules, no_inclusive) == []  # 143.75: with the tax of cac:TaxTotal
    assert refusals(sample_rules, _amount(no_inclusive, "PayableAmount", "115.00")) == []  # without it
    assert refusals(sample_rules, _amount(no_inclusive, "PayableAmount", "130.00")) == ["TOT-04"]
    # no tax at all: the payable amount is the tax-exclusive total
    no_tax = _without(TAX_ORDER, "TaxInclusiveAmount", "TaxTotal", "ClassifiedTaxCategory")
    assert refusals(sample_rules, _amount(no_tax, "PayableAmount", "115.00")) == []
    assert refusals(sample_rules, no_tax) == ["TOT-04"]


def test_the_tax_inclusive_amount_includes_the_tax(sample_rules):
    wrong = _amount(_amount(TAX_ORDER, "TaxInclusiveAmount", "115.00"), "PayableAmount", "115.00")
    found = [f for f in findings(sample_rules, wrong) if f.is_error]
    assert [f.assertion.id for f in found] == ["TOT-06"]
    assert "143.75" in found[0].text and "within 0.01 EUR" in found[0].text


def _line_order(currency: str, quantity: str, price: str, amount: str, base: str | None = None) -> bytes:
    order = TAX_ORDER.decode()
    order = order.replace('currencyID="EUR"', f'currencyID="{currency}"').replace(
        "<cbc:DocumentCurrencyCode>EUR<", f"<cbc:DocumentCurrencyCode>{currency}<"
    )
    root = etree.fromstring(order.encode())
    ns = {"cac": CAC, "cbc": CBC}
    for el in root.findall("cac:TaxTotal", ns) + root.findall("cac:OrderLine", ns)[1:]:
        root.remove(el)
    item = root.find("cac:OrderLine/cac:LineItem", ns)
    item.find("cbc:Quantity", ns).text = quantity
    item.find("cbc:LineExtensionAmount", ns).text = amount
    item.find("cac:Price/cbc:PriceAmount", ns).text = price
    base_quantity = item.find("cac:Price/cbc:BaseQuantity", ns)
    if base is None:
        base_quantity.getparent().remove(base_quantity)
    else:
        base_quantity.text = base
    total = root.find("cac:AnticipatedMonetaryTotal", ns)
    for el in list(total):
        if etree.QName(el).localname in ("TaxExclusiveAmount", "TaxInclusiveAmount"):
            total.remove(el)
        else:
            el.text = amount
    return etree.tostring(root)


@pytest.mark.parametrize(
    "currency, quantity, price, base, amounts_ok, amounts_refused",
    [
        # 3 x 333.33 JPY = 999.99: a yen amount is whole, rounded or cut off
        ("JPY", "3", "333.33", None, ["1000", "999"], ["998", "1002"]),
        # 7 x 1234 JPY per 10 = 863.8
        ("JPY", "7", "1234", "10", ["864", "863"], ["862", "866"]),
        # 3 x 0.3333 EUR = 0.9999
        ("EUR", "3", "0.3333", None, ["1.00", "0.99"], ["0.98", "1.02"]),
        # 2.5 kg at 4.99 EUR per 2 kg = 6.2375
        ("EUR", "2.5", "4.99", "2", ["6.24", "6.23"], ["6.22", "6.26"]),
        # 3 x 0.3333 KWD = 0.9999 (three decimals)
        ("KWD", "3", "0.3333", None, ["1.000", "0.999"], ["0.998", "1.001"]),
    ],
)
def test_a_line_amount_is_compared_within_the_currency_slack(
    sample_rules, currency, quantity, price, base, amounts_ok, amounts_refused
):
    for amount in amounts_ok:
        assert refusals(sample_rules, _line_order(currency, quantity, price, amount, base)) == [], amount
    for amount in amounts_refused:
        found = [f for f in findings(sample_rules, _line_order(currency, quantity, price, amount, base)) if f.is_error]
        assert [f.assertion.id for f in found] == ["LIN-06"], amount
        slack = {"JPY": "1", "EUR": "0.01", "KWD": "0.001"}[currency]
        assert f"within {slack} {currency}" in found[0].text and "correct" in found[0].text


def test_a_base_quantity_must_be_above_zero(sample_rules):
    zero = _line_order("EUR", "3", "2.50", "7.50", base="0")
    assert refusals(sample_rules, zero) == ["LIN-07"]
    assert refusals(sample_rules, _line_order("EUR", "3", "2.50", "7.50", base="1")) == []
