"""The helpers the generated code calls for everything but its common fast
paths: SQL three-valued comparisons, BETWEEN, IN, LIKE and arithmetic, and
string properties read as numbers (:data:`STRING_NUMBERS_PROPERTY`). None
stands for NULL / UNKNOWN; none of them raises for any operand."""

from __future__ import annotations

import math
import re
from typing import Any

from .xpath import _xpath

__all__ = ["STRING_NUMBERS_PROPERTY", "string_number"]

#: A message whose boolean property of this name is true has its string
#: properties read as numbers where a selector wants a number (see the package doc).
STRING_NUMBERS_PROPERTY = "JMS_StringNumbers"
#: The range of a JMS long: an integer literal or string number outside it is none.
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


def _num(v: Any) -> Any:
    """``v`` if it is a JMS number (int or float but not bool), else None."""
    c = v.__class__
    if c is int or c is float:
        return v
    if c is bool or v is None:
        return None
    return v if isinstance(v, (int, float)) else None


def _kind(v: Any) -> int:
    """1 string, 2 number, 3 boolean, 0 a type the selector does not know."""
    c = v.__class__
    if c is str:
        return 1
    if c is int or c is float:
        return 2
    if c is bool:
        return 3
    if isinstance(v, str):
        return 1
    if isinstance(v, (int, float)):
        return 2
    return 0


# Comparisons: UNKNOWN when an operand is NULL; FALSE (whatever the operator)
# when the operands are of unlike types or of a type the selector does not know.


def _eq(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    k = _kind(a)
    if k == 0 or k != _kind(b):
        return False  # unlike types
    return True if a == b else False


def _ne(a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    k = _kind(a)
    if k == 0 or k != _kind(b):
        return False  # unlike types: FALSE too, not the negation of _eq
    return False if a == b else True


def _unordered(a: Any, b: Any) -> bool | None:
    """``<`` ``<=`` ``>`` ``>=`` of two non-NULL values that are not both
    numbers: UNKNOWN for two strings or two booleans (JMS does not order
    them), FALSE for unlike types."""
    k = _kind(a)
    return None if k != 0 and k == _kind(b) else False


def _lt(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x < y


def _le(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x <= y


def _gt(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x > y


def _ge(a: Any, b: Any) -> bool | None:
    x, y = _num(a), _num(b)
    if x is None or y is None:
        return None if a is None or b is None else _unordered(a, b)
    return x >= y


def _between(x: Any, lo: Any, hi: Any) -> bool | None:  # lo <= x AND x <= hi
    first = _le(lo, x)
    if first is False:
        return False
    second = _le(x, hi)
    if second is False:
        return False
    return None if first is None or second is None else True


def _not_between(x: Any, lo: Any, hi: Any) -> bool | None:  # x < lo OR x > hi
    first = _lt(x, lo)
    if first is True:
        return True
    second = _gt(x, hi)
    if second is True:
        return True
    return None if first is None or second is None else False


# IN and LIKE: UNKNOWN for NULL; for any other non-string, IN and LIKE are
# FALSE and NOT IN and NOT LIKE are TRUE.


def _in(v: Any, values: frozenset) -> bool | None:
    if v is None:
        return None
    return (v in values) if isinstance(v, str) else False


def _not_in(v: Any, values: frozenset) -> bool | None:
    if v is None:
        return None
    return (v not in values) if isinstance(v, str) else True


def _like(v: Any, regex: re.Pattern) -> bool | None:
    if v is None:
        return None
    return (regex.fullmatch(v) is not None) if isinstance(v, str) else False


def _not_like(v: Any, regex: re.Pattern) -> bool | None:
    if v is None:
        return None
    return (regex.fullmatch(v) is None) if isinstance(v, str) else True


def _neg(v: Any) -> Any:
    v = _num(v)
    return None if v is None else -v


def _add(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a + b
    except ArithmeticError:  # int too large to convert to float
        return None


def _sub(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a - b
    except ArithmeticError:
        return None


def _mul(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None:
        return None
    try:
        return a * b
    except ArithmeticError:
        return None


def _div(a: Any, b: Any) -> Any:
    a, b = _num(a), _num(b)
    if a is None or b is None or b == 0:
        return None
    try:
        if isinstance(a, int) and isinstance(b, int):  # Java: truncate toward zero
            q = a // b
            return q + 1 if q < 0 and q * b != a else q
        return a / b
    except ArithmeticError:
        return None


_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_EXACT = re.compile(r"[+-]?[0-9]+")
#: Longer strings are not numbers to a selector (a long has 19 digits, a double ~17 significant ones).
_MAX_NUMBER_TEXT = 64


def string_number(text: str) -> int | float | None:
    """The number a string holds as a decimal literal (an int without
    fraction or exponent, within a long; else a finite float), or None."""
    if len(text) > _MAX_NUMBER_TEXT or _DECIMAL.fullmatch(text) is None:
        return None
    if _EXACT.fullmatch(text) is not None:
        value = int(text)
        return value if _LONG_MIN <= value <= _LONG_MAX else None
    value = float(text)
    return value if math.isfinite(value) else None


#: Strings seen lately and what they hold (``v`` itself for a string that is no
#: number): a value is parsed once, not at every evaluation by every consumer.
_string_numbers: dict[str, Any] = {}
_STRING_NUMBERS_KEPT = 4096


def _sn(v: Any, props: Any) -> Any:
    """A string property where a number is wanted: its number when the
    message is marked so and it holds one, else the string itself."""
    if props.get(STRING_NUMBERS_PROPERTY) is not True or v.__class__ is not str:
        return v
    n = _string_numbers.get(v)
    if n is None:
        n = string_number(v)
        if n is None:
            n = v
        if len(_string_numbers) >= _STRING_NUMBERS_KEPT:
            _string_numbers.clear()
        _string_numbers[v] = n
    return n


def _pair(a: Any, b: Any, props: Any, ordering: bool) -> tuple[Any, Any]:
    """Two identifiers compared: for ``<`` ``<=`` ``>`` ``>=`` (``ordering``)
    each string is read as a number; for ``=`` and ``<>`` a string only when
    the other is a number."""
    if a.__class__ is not str and b.__class__ is not str:
        return a, b
    if ordering:
        return _sn(a, props), _sn(b, props)
    if isinstance(a, str) and _num(b) is not None:
        return _sn(a, props), b
    if isinstance(b, str) and _num(a) is not None:
        return a, _sn(b, props)
    return a, b


_ARITH = {"+": _add, "-": _sub, "*": _mul, "/": _div}
_ARITH_NAMES = {"+": "_add", "-": "_sub", "*": "_mul", "/": "_div"}


def _chain(ops: tuple, values: tuple) -> Any:
    result = values[0]
    for op, value in zip(ops, values[1:], strict=False):
        result = _ARITH[op](result, value)
    return result


_RUNTIME = {
    "__builtins__": {},
    "_eq": _eq,
    "_ne": _ne,
    "_lt": _lt,
    "_le": _le,
    "_gt": _gt,
    "_ge": _ge,
    "_between": _between,
    "_not_between": _not_between,
    "_in": _in,
    "_not_in": _not_in,
    "_like": _like,
    "_not_like": _not_like,
    "_neg": _neg,
    "_num": _num,
    "_add": _add,
    "_sub": _sub,
    "_mul": _mul,
    "_div": _div,
    "_chain": _chain,
    "_xpath": _xpath,
    "_sn": _sn,
    "_pair": _pair,
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
}
_SLOW_CMP = {"=": "_eq", "<>": "_ne", "<": "_lt", "<=": "_le", ">": "_gt", ">=": "_ge"}
_PY_CMP = {"=": "==", "<>": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
