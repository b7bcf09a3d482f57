"""A body of a sequence of typed values, read back in order through the
conversion table: :class:`StreamMessage`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .._envelope import Byte, Float, Int, Short
from .._errors import MessageEOFError, MessageFormatError, MessageNotReadableError, MessageNotWriteableError
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


class StreamMessage(Message):
    """A message whose body is a sequence of typed values, read back in order
    with the JMS stream conversion table (``write_int`` reads back with
    ``read_long`` or ``read_string``, not ``read_short``)."""

    __slots__ = ("_items", "_pos")
    kind = "stream"

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._items: list[Any] | tuple[Any, ...] = []
        self._pos = -1
        for value in values or ():
            self.write_object(value)

    def _clear_body(self) -> None:
        self._items = []
        self._pos = -1

    def _body_snapshot(self) -> Any:
        return tuple(self._items)

    def _set_body_from(self, body: Any) -> None:
        self._items = body
        self._pos = 0

    def reset(self) -> None:
        """Make the body read-only and move to its first value."""
        self._items = tuple(self._items)
        self._body_ro = True
        self._pos = 0

    def _append(self, value: Any) -> None:
        self._check_body_writable()
        if self._pos >= 0:
            raise MessageNotWriteableError("the body is in read mode; call clear_body() to write again")
        self._items.append(value)  # type: ignore[union-attr]

    def write_boolean(self, value: bool) -> None:
        self._append(check_bool(value, "write_boolean"))

    def write_byte(self, value: int) -> None:
        self._append(check_int(Byte, value, "write_byte"))

    def write_short(self, value: int) -> None:
        self._append(check_int(Short, value, "write_short"))

    def write_char(self, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1:
            raise MessageFormatError("write_char takes a one-character string")
        self._append(Char(value))

    def write_int(self, value: int) -> None:
        self._append(check_int(Int, value, "write_int"))

    def write_long(self, value: int) -> None:
        self._append(check_int(int, value, "write_long"))

    def write_float(self, value: float) -> None:
        self._append(check_float(Float, value, "write_float"))

    def write_double(self, value: float) -> None:
        self._append(check_float(float, value, "write_double"))

    def write_string(self, value: str | None) -> None:
        self._append(None if value is None else check_str(value, "write_string"))

    def write_bytes(self, value: bytes) -> None:
        self._append(bytes(value))

    def write_object(self, value: BodyValue | bytearray | memoryview | None) -> None:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        self._append(None if value is None else check_object(value, "write_object", allow_bytes=True))

    def _next(self, convert: Callable[..., Any], *args: Any) -> Any:
        if self._pos < 0:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        if self._pos >= len(self._items):
            raise MessageEOFError("no more values in the stream")
        value = convert(*args, self._items[self._pos], f"stream value {self._pos}")
        self._pos += 1  # a failed conversion does not move past the value
        return value

    @staticmethod
    def _null_number(convert: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if args[-2] is None:
                raise MessageFormatError(f"{args[-1]} is null and has no numeric value")
            return convert(*args)

        return run

    def read_boolean(self) -> bool:
        return self._next(lambda v, w: False if v is None else to_bool(v, w))

    def read_byte(self) -> int:
        return self._next(self._null_number(to_integer), Byte)

    def read_short(self) -> int:
        return self._next(self._null_number(to_integer), Short)

    def read_char(self) -> str:
        return self._next(self._null_number(to_char))

    def read_int(self) -> int:
        return self._next(self._null_number(to_integer), Int)

    def read_long(self) -> int:
        return self._next(self._null_number(to_integer), int)

    def read_float(self) -> float:
        return self._next(self._null_number(to_float))

    def read_double(self) -> float:
        return self._next(self._null_number(to_double))

    def read_string(self) -> str | None:
        return self._next(to_string)

    def read_bytes(self) -> bytes | None:
        return self._next(to_bytes)

    def read_object(self) -> BodyValue | None:
        result: BodyValue | None = self._next(lambda v, w: v)
        return result
