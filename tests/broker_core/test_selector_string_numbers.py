"""Selectors on messages whose properties are all strings (sent over STOMP).

A message marked with the boolean property ``JMS_StringNumbers`` has its
string properties read as numbers where a selector wants a number, as
ActiveMQ does for STOMP (its ComparisonExpression converts a String operand
compared with a Number): in arithmetic, BETWEEN, ``<`` ``<=`` ``>`` ``>=``,
and ``=`` / ``<>`` against a number. Only decimal literals convert. Every
other message keeps the JMS rule (JMS 2.0 section 3.8.1.2: only like types
compare), and typed properties are never affected.

Outcomes are three-valued (T, F, U), told apart as in test_selectors.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core import STRING_NUMBERS_PROPERTY, string_number
from broker_core._envelope import Envelope, Int
from broker_core._selector import compile_selector

T, F, U = "T", "F", "U"
MARK = {STRING_NUMBERS_PROPERTY: True}


def env(props) -> Envelope:
    return Envelope(
        message_id="ID:1",
        destination=None,
        delivery_mode=2,
        priority=4,
        expiration=0,
        timestamp=1000,
        correlation_id=None,
        reply_to=None,
        type="5",
        properties=dict(props),
        kind="text",
        body="",
    )


def outcome(selector: str, props) -> str:
    e = env(props)
    if compile_selector(selector).matches(e):
        return T
    if compile_selector(f"NOT ({selector})").matches(e):
        return F
    return U


CONVERTED = [
    # (selector, property value, outcome on a marked message)
    ("amount > 100", "150", T),
    ("amount > 100", "100", F),
    ("amount >= 100", "100", T),
    ("amount < 100", "150", F),
    ("amount <= 150.0", "150", T),
    ("amount = 150", "150", T),
    ("amount <> 150", "150", F),
    ("amount = 150.0", "150", T),
    ("amount = 12.5", "12.5", T),
    ("amount > 12", "12.5", T),
    ("amount = 1000", "1e3", T),
    ("amount = 1000", "1E+3", T),
    ("amount = 7", "+7", T),
    ("amount < 0", "-7", T),
    ("amount = 0.5", ".5", T),
    ("amount = 5", "5.", T),
    ("amount BETWEEN 100 AND 200", "150", T),
    ("amount NOT BETWEEN 100 AND 200", "150", F),
    ("amount BETWEEN 100 AND 200", "250", F),
    ("amount * 2 = 300", "150", T),
    ("amount + 1 > 150", "150", T),
    ("amount / 4 = 37", "150", T),  # exact / exact truncates, as Java does
    ("-amount = -150", "150", T),
    ("+amount = 150", "150", T),
    ("amount * 1.5 > 200", "150", T),
    ("100 < amount", "150", T),
]


@pytest.mark.parametrize("selector, value, expected", CONVERTED)
def test_string_numbers_of_a_marked_message_compare_as_numbers(selector, value, expected):
    assert outcome(selector, {**MARK, "amount": value}) == expected


@pytest.mark.parametrize("selector, value, expected", CONVERTED)
def test_the_same_strings_keep_the_jms_rule_on_an_unmarked_message(selector, value, expected):
    """A string never compares with a number: FALSE whatever the operator;
    arithmetic on it is NULL, so what uses it is UNKNOWN."""
    plain = outcome(selector, {"amount": value})
    arithmetic = any(op in selector for op in ("*", "/", "+ ", "-amount", "+amount"))
    assert plain == (U if arithmetic else F)
    assert outcome(selector, {STRING_NUMBERS_PROPERTY: "true", "amount": value}) == plain  # only a boolean marks
    assert outcome(selector, {STRING_NUMBERS_PROPERTY: False, "amount": value}) == plain


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        " 150",
        "150 ",
        "1,000",
        "0x10",
        "017x",
        "NaN",
        "Infinity",
        "1e999",
        "",
        "150L",
        "1.5f",
        "9223372036854775808",
        "--1",
        "1e",
        ".",
        "+",
        "1" * 65,
    ],
)
def test_strings_that_are_not_decimal_literals_are_not_numbers(value):
    assert string_number(value) is None
    props = {**MARK, "amount": value}
    assert outcome("amount > 100", props) == F
    assert outcome("amount = 100", props) == F
    assert outcome("amount <> 100", props) == F
    assert outcome("amount * 2 > 100", props) == U


def test_the_limits_of_a_long_convert():
    assert string_number("9223372036854775807") == 2**63 - 1
    assert string_number("-9223372036854775808") == -(2**63)
    assert outcome("amount > 9223372036854775806", {**MARK, "amount": "9223372036854775807"}) == T


def test_strings_stay_strings_where_a_string_is_wanted():
    props = {**MARK, "amount": "150", "code": "007"}
    assert outcome("amount = '150'", props) == T
    assert outcome("amount = '150.0'", props) == F
    assert outcome("amount IN ('150', '200')", props) == T
    assert outcome("amount LIKE '15%'", props) == T
    assert outcome("code = 7", props) == T
    assert outcome("code = '7'", props) == F


def test_two_identifiers():
    both = {**MARK, "a": "10", "b": "9"}
    assert outcome("a > b", both) == T  # ordering wants numbers: both convert
    assert outcome("a = b", both) == F  # two strings compare as strings
    assert outcome("a = b", {**MARK, "a": "10", "b": "10.0"}) == F
    assert outcome("a = b", {**MARK, "a": "10", "b": 10}) == T  # a string against a number converts
    assert outcome("a = b", {**MARK, "a": 10.0, "b": "10"}) == T
    assert outcome("a <> b", {**MARK, "a": "10", "b": Int(11)}) == T
    assert outcome("a > b", {"a": "10", "b": "9"}) == U  # JMS: strings are not ordered
    assert outcome("a = b", {"a": "10", "b": 10}) == F


def test_typed_properties_and_headers_are_not_affected():
    assert outcome("amount > 100", {**MARK, "amount": Int(150)}) == T
    assert outcome("amount > 100", {**MARK, "amount": 99.5}) == F
    assert outcome("flag = TRUE", {**MARK, "flag": "true"}) == F  # only numbers convert, not booleans
    assert outcome("JMSType = 5", {**MARK}) == F  # a header, not a property
    assert outcome("amount > 100", {**MARK}) == U  # absent: NULL as ever


NUMBERS = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False))
NUMERIC_SELECTORS = [
    "amount > 100",
    "amount = 42",
    "amount <> 42",
    "amount <= -3.25",
    "amount BETWEEN -5 AND 5.5",
    "amount NOT BETWEEN 0 AND 1",
    "amount * 2 > 7",
    "amount - 1 < amount",
    "amount / 3 = 1",
    "-amount >= 0",
]


@settings(max_examples=300, deadline=None)
@given(n=NUMBERS, selector=st.sampled_from(NUMERIC_SELECTORS))
def test_a_number_sent_as_text_selects_as_the_number_itself(n, selector):
    text = str(n)  # what a STOMP client sends: the number's decimal form
    assert string_number(text) == n
    assert outcome(selector, {**MARK, "amount": text}) == outcome(selector, {"amount": n})
