"""A body of bytes written and read as a stream of typed primitives
(Java's ``DataOutput``): :class:`BytesMessage`."""

from __future__ import annotations

import struct
from typing import Any

from .._envelope import Byte, Float, Int, Short
from .._errors import MessageEOFError, MessageFormatError, MessageNotReadableError, MessageNotWriteableError
from .base import Message
from .properties import BodyValue, Char, check_bool, check_float, check_int, check_str

_S_BYTE, _S_UBYTE, _S_SHORT, _S_USHORT = (
    struct.Struct(">b"),
    struct.Struct(">B"),
    struct.Struct(">h"),
    struct.Struct(">H"),
)
_S_INT, _S_LONG, _S_FLOAT, _S_DOUBLE = (
    struct.Struct(">i"),
    struct.Struct(">q"),
    struct.Struct(">f"),
    struct.Struct(">d"),
)


class BytesMessage(Message):
    """A message whose body is a stream of bytes, written and read with the
    JMS primitives (big-endian, as Java's ``DataOutputStream``).

    A new message is write-only; ``reset()`` (or receiving it) makes it
    read-only and positions reading at the start.
    """

    __slots__ = ("_buf", "_data", "_pos")
    kind = "bytes"

    def __init__(self, data: bytes | None = None) -> None:
        super().__init__()
        self._buf = bytearray(data or b"")
        self._data: bytes | None = None
        self._pos = 0

    def _clear_body(self) -> None:
        self._buf = bytearray()
        self._data = None
        self._pos = 0

    def _body_snapshot(self) -> Any:
        return self._data if self._data is not None else bytes(self._buf)

    def _set_body_from(self, body: Any) -> None:
        self._buf = bytearray()
        self._data = body or b""
        self._pos = 0

    def reset(self) -> None:
        """Make the body read-only and move to its start."""
        if self._data is None:
            self._data = bytes(self._buf)
            self._buf = bytearray()
        self._body_ro = True
        self._pos = 0

    @property
    def body_length(self) -> int:
        """Length of the body in bytes (read mode only)."""
        if self._data is None:
            raise MessageNotReadableError("body_length is only available in read mode; call reset() first")
        return len(self._data)

    def get_body(self) -> bytes:
        """The whole body, in either mode."""
        return self._data if self._data is not None else bytes(self._buf)

    # writing
    def _w(self, chunk: bytes) -> None:
        self._check_body_writable()
        if self._data is not None:
            raise MessageNotWriteableError("the body is in read mode; call clear_body() to write again")
        self._buf += chunk

    def write_boolean(self, value: bool) -> None:
        self._w(b"\x01" if check_bool(value, "write_boolean") else b"\x00")

    def write_byte(self, value: int) -> None:
        self._w(_S_BYTE.pack(check_int(Byte, value, "write_byte")))

    def write_short(self, value: int) -> None:
        self._w(_S_SHORT.pack(check_int(Short, value, "write_short")))

    def write_char(self, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1 or ord(value) > 0xFFFF:
            raise MessageFormatError("write_char takes one character from the Basic Multilingual Plane")
        self._w(_S_USHORT.pack(ord(value)))

    def write_int(self, value: int) -> None:
        self._w(_S_INT.pack(check_int(Int, value, "write_int")))

    def write_long(self, value: int) -> None:
        self._w(_S_LONG.pack(check_int(int, value, "write_long")))

    def write_float(self, value: float) -> None:
        self._w(_S_FLOAT.pack(check_float(Float, value, "write_float")))

    def write_double(self, value: float) -> None:
        self._w(_S_DOUBLE.pack(check_float(float, value, "write_double")))

    def write_utf(self, value: str) -> None:
        """Write a string as a 2-byte length and UTF-8 (Java's modified UTF-8
        differs only for NUL and astral characters)."""
        data = check_str(value, "write_utf").encode("utf-8")
        if len(data) > 0xFFFF:
            raise MessageFormatError("write_utf: the encoded string is longer than 65535 bytes")
        self._w(_S_USHORT.pack(len(data)) + data)

    def write_bytes(self, value: bytes, offset: int = 0, length: int | None = None) -> None:
        view = bytes(value)
        end = len(view) if length is None else offset + length
        self._w(view[offset:end])

    def write_object(self, value: BodyValue | bytearray) -> None:
        """Write a bool, int (as long), float (as double), str (as UTF), bytes,
        or a narrow type (``Byte``, ``Short``, ``Int``, ``Float``, ``Char``)."""
        writer = {
            bool: self.write_boolean,
            Byte: self.write_byte,
            Short: self.write_short,
            Int: self.write_int,
            int: self.write_long,
            Float: self.write_float,
            float: self.write_double,
            str: self.write_utf,
            Char: self.write_char,
            bytes: self.write_bytes,
            bytearray: self.write_bytes,
        }.get(type(value))
        if writer is None:
            raise MessageFormatError(f"write_object: {type(value).__name__} is not a JMS primitive type")
        writer(value)

    # reading
    def _r(self, size: int) -> bytes:
        data = self._data
        if data is None:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        pos = self._pos
        if pos + size > len(data):
            raise MessageEOFError(f"read past the end of the body ({len(data) - pos} bytes left, {size} needed)")
        self._pos = pos + size
        return data[pos : pos + size]

    def read_boolean(self) -> bool:
        return self._r(1) != b"\x00"

    def read_byte(self) -> int:
        return _S_BYTE.unpack(self._r(1))[0]

    def read_unsigned_byte(self) -> int:
        return _S_UBYTE.unpack(self._r(1))[0]

    def read_short(self) -> int:
        return _S_SHORT.unpack(self._r(2))[0]

    def read_unsigned_short(self) -> int:
        return _S_USHORT.unpack(self._r(2))[0]

    def read_char(self) -> str:
        return chr(_S_USHORT.unpack(self._r(2))[0])

    def read_int(self) -> int:
        return _S_INT.unpack(self._r(4))[0]

    def read_long(self) -> int:
        return _S_LONG.unpack(self._r(8))[0]

    def read_float(self) -> float:
        return _S_FLOAT.unpack(self._r(4))[0]

    def read_double(self) -> float:
        return _S_DOUBLE.unpack(self._r(8))[0]

    def read_utf(self) -> str:
        start = self._pos
        length = _S_USHORT.unpack(self._r(2))[0]
        try:
            return self._r(length).decode("utf-8")
        except (MessageEOFError, UnicodeDecodeError) as exc:
            self._pos = start
            raise MessageFormatError(f"read_utf: no valid UTF string here ({exc})") from None

    def read_bytes(self, length: int | None = None) -> bytes:
        """Read up to ``length`` bytes (all that is left when omitted); at the
        end of the body returns ``b""``."""
        data = self._data
        if data is None:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        end = len(data) if length is None else min(len(data), self._pos + length)
        chunk = data[self._pos : end]
        self._pos = end
        return chunk
