"""A body of named typed values: :class:`MapMessage`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._envelope import Byte, Float, Int, Short
from .._errors import InvalidPropertyError, MessageFormatError
from .base import Message
from .properties import (
    BodyValue,
    Char,
    check_bool,
    check_float,
    check_int,
    check_object,
    check_str,
    to_bool,
    to_bytes,
    to_char,
    to_double,
    to_float,
    to_integer,
    to_string,
)


class MapMessage(Message):
    """A message whose body is a set of name-value pairs with JMS types.

    Typed pairs ``set_int(name, v)`` / ``get_int(name)`` and so on follow the
    JMS conversion table; ``map_names()`` and ``item_exists(name)`` inspect it.
    """

    __slots__ = ("_map",)
    kind = "map"

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._map: dict[str, Any] = {}
        if values:
            for name, value in values.items():
                self.set_object(name, value)

    def _clear_body(self) -> None:
        self._map = {}

    def _body_snapshot(self) -> Any:
        return dict(self._map)

    def _set_body_from(self, body: Any) -> None:
        self._map = body

    def _put(self, name: str, value: Any) -> None:
        self._check_body_writable()
        if not isinstance(name, str) or not name:
            raise InvalidPropertyError(f"map entry name must be a non-empty string, got {name!r}")
        self._map[name] = value

    def map_names(self) -> list[str]:
        return list(self._map)

    def item_exists(self, name: str) -> bool:
        return name in self._map

    def set_boolean(self, name: str, value: bool) -> None:
        self._put(name, check_bool(value, f"map entry {name!r}"))

    def set_byte(self, name: str, value: int) -> None:
        self._put(name, check_int(Byte, value, f"map entry {name!r}"))

    def set_short(self, name: str, value: int) -> None:
        self._put(name, check_int(Short, value, f"map entry {name!r}"))

    def set_char(self, name: str, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1:
            raise MessageFormatError(f"map entry {name!r}: a char is a one-character string")
        self._put(name, Char(value))

    def set_int(self, name: str, value: int) -> None:
        self._put(name, check_int(Int, value, f"map entry {name!r}"))

    def set_long(self, name: str, value: int) -> None:
        self._put(name, check_int(int, value, f"map entry {name!r}"))

    def set_float(self, name: str, value: float) -> None:
        self._put(name, check_float(Float, value, f"map entry {name!r}"))

    def set_double(self, name: str, value: float) -> None:
        self._put(name, check_float(float, value, f"map entry {name!r}"))

    def set_string(self, name: str, value: str | None) -> None:
        self._put(name, None if value is None else check_str(value, f"map entry {name!r}"))

    def set_bytes(self, name: str, value: bytes | bytearray | None) -> None:
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise MessageFormatError(f"map entry {name!r}: expected bytes, got {type(value).__name__}")
        self._put(name, None if value is None else bytes(value))

    def set_object(self, name: str, value: BodyValue | bytearray | memoryview | None) -> None:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        self._put(name, None if value is None else check_object(value, f"map entry {name!r}", allow_bytes=True))

    def _read(self, name: str) -> Any:
        return self._map.get(name)

    def get_boolean(self, name: str) -> bool:
        value = self._read(name)
        return False if value is None else to_bool(value, f"map entry {name!r}")

    def _number(self, name: str, convert: Callable[..., Any], *args: Any) -> Any:
        value = self._read(name)
        if value is None:
            raise MessageFormatError(f"map entry {name!r} is not set, so it has no numeric value")
        return convert(*args, value, f"map entry {name!r}")

    def get_byte(self, name: str) -> int:
        return self._number(name, to_integer, Byte)

    def get_short(self, name: str) -> int:
        return self._number(name, to_integer, Short)

    def get_int(self, name: str) -> int:
        return self._number(name, to_integer, Int)

    def get_long(self, name: str) -> int:
        return self._number(name, to_integer, int)

    def get_float(self, name: str) -> float:
        return self._number(name, to_float)

    def get_double(self, name: str) -> float:
        return self._number(name, to_double)

    def get_char(self, name: str) -> str:
        return self._number(name, to_char)

    def get_string(self, name: str) -> str | None:
        return to_string(self._read(name), f"map entry {name!r}")

    def get_bytes(self, name: str) -> bytes | None:
        return to_bytes(self._read(name), f"map entry {name!r}")

    def get_object(self, name: str) -> BodyValue | None:
        return self._read(name)
