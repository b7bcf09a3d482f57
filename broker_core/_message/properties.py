"""Typed values: property names, and the JMS conversion table (JMS 1.1, 3.5.4)
that property, map and stream values are set and read through."""

from __future__ import annotations

from typing import Any

from .._envelope import Byte, Float, Int, Short
from .._errors import InvalidPropertyError, MessageFormatError


class Char(str):
    """A JMS ``char`` value: a one-character string (map and stream bodies)."""

    __slots__ = ()


#: A property's value (``Byte``, ``Short``, ``Int`` and ``Float`` are ``int`` and ``float``).
PropertyValue = bool | int | float | str
#: A value of a map or stream body: a property's, or bytes (``Char`` is a ``str``).
BodyValue = bool | int | float | str | bytes


_SELECTOR_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
#: JMSX properties a client may set; the others are set by the broker.
_CLIENT_JMSX = frozenset({"JMSXGroupID", "JMSXGroupSeq", "JMSXUserID", "JMSXAppID"})
_valid_names: set[str] = set()


def check_property_name(name: Any) -> str:
    """Return ``name`` if it is a valid property name, else raise
    :class:`InvalidPropertyError` saying which rule it breaks."""
    if name in _valid_names:
        return name
    if not isinstance(name, str) or not name:
        raise InvalidPropertyError(f"property name must be a non-empty string, got {name!r}")
    if not name.replace("$", "_").isidentifier():
        raise InvalidPropertyError(
            f"property name {name!r} is not a Java identifier (start with a letter, '_' or '$'; "
            "then letters, digits, '_' or '$')"
        )
    if name.upper() in _SELECTOR_KEYWORDS:
        raise InvalidPropertyError(f"property name {name!r} is a selector keyword and cannot name a property")
    if name.startswith("JMSX"):
        if name not in _CLIENT_JMSX:
            raise InvalidPropertyError(
                f"property name {name!r} is reserved: only {sorted(_CLIENT_JMSX)} of the JMSX properties may be set"
            )
    elif name.startswith("JMS") and not name.startswith("JMS_"):
        raise InvalidPropertyError(f"property name {name!r} is reserved: names starting with 'JMS' belong to JMS")
    if len(_valid_names) < 10_000:
        _valid_names.add(name)
    return name


_INT_RANGES = {
    Byte: (-(2**7), 2**7 - 1),
    Short: (-(2**15), 2**15 - 1),
    Int: (-(2**31), 2**31 - 1),
    int: (-(2**63), 2**63 - 1),
}
_TYPE_NAMES = {
    bool: "boolean",
    Byte: "byte",
    Short: "short",
    Int: "int",
    int: "long",
    Float: "float",
    float: "double",
    str: "String",
    Char: "char",
    bytes: "byte[]",
}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _ranged(kind: type, value: Any, what: str) -> int:
    low, high = _INT_RANGES[kind]
    if not low <= value <= high:
        raise MessageFormatError(f"{what}: {value} is out of range for a {_TYPE_NAMES[kind]} ({low}..{high})")
    return value if kind is int else kind(value)


def _parse_int(kind: type, text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise MessageFormatError(f"{what}: the string {text!r} is not a {_TYPE_NAMES[kind]}") from None
    return _ranged(kind, value, what)


# The JMS 1.1 table: which stored types each getter accepts (strings parse).
_INT_ACCEPTS = {Byte: (Byte,), Short: (Byte, Short), Int: (Byte, Short, Int), int: (Byte, Short, Int, int)}


def to_bool(value: Any, what: str) -> bool:
    if type(value) is bool:
        return value
    if type(value) is str:
        return value.lower() == "true"
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a boolean")


def to_integer(kind: type, value: Any, what: str) -> int:
    t = type(value)
    if t in _INT_ACCEPTS[kind]:
        return int(value) if kind is int else kind(value)
    if t is str:
        return _parse_int(kind, value, what)
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a {_TYPE_NAMES[kind]}")


def to_float(value: Any, what: str) -> float:
    t = type(value)
    if t is Float:
        return value
    if t is str:
        try:
            return Float(float(value))
        except ValueError:
            raise MessageFormatError(f"{what}: the string {value!r} is not a float") from None
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a float")


def to_double(value: Any, what: str) -> float:
    t = type(value)
    if t is float or t is Float:
        return float(value)
    if t is str:
        try:
            return float(value)
        except ValueError:
            raise MessageFormatError(f"{what}: the string {value!r} is not a double") from None
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a double")


def to_string(value: Any, what: str) -> str | None:
    if value is None or type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is bytes:
        raise MessageFormatError(f"{what}: a byte[] cannot be read as a String")
    return str(value)


def to_char(value: Any, what: str) -> str:
    if type(value) is Char:
        return value
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a char")


def to_bytes(value: Any, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as byte[]")


def check_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise MessageFormatError(f"{what}: expected a bool, got {_type_name(value)}")
    return value


def check_int(kind: type, value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MessageFormatError(f"{what}: expected an int for a {_TYPE_NAMES[kind]}, got {_type_name(value)}")
    return _ranged(kind, value, what)


def check_float(kind: type, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MessageFormatError(f"{what}: expected a float for a {_TYPE_NAMES[kind]}, got {_type_name(value)}")
    return Float(value) if kind is Float else float(value)


def check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MessageFormatError(f"{what}: expected a str, got {_type_name(value)}")
    return str(value)


def check_object(value: Any, what: str, *, allow_bytes: bool) -> Any:
    """Validate a value given to ``set_object_*``: the JMS primitive wrappers."""
    t = type(value)
    if t in (bool, str, Byte, Short, Int, Float, float, Char) or (allow_bytes and t is bytes):
        return value
    if t is int:
        return _ranged(int, value, what)
    if isinstance(value, bool):
        return bool(value)
    raise InvalidPropertyError(
        f"{what}: {type(value).__name__} is not a JMS {'map or stream' if allow_bytes else 'property'} type "
        "(bool, int, float, str" + (", bytes" if allow_bytes else "") + ")"
    )
