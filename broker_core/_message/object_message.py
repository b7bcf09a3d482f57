"""A body of one JSON-like object: :class:`ObjectMessage`."""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
from typing import Any

from .._errors import MessageFormatError
from .base import Message


class ObjectMessage(Message):
    """A message whose body is a Python value, read and written as ``object``.

    It never pickles. The value is serialised when set, as JSON with type tags,
    from an allow-list of plain types: ``None``, ``bool``, ``int``, ``float``
    (including nan and infinities), ``str``, ``bytes``, ``decimal.Decimal``,
    ``datetime.date``, ``datetime.datetime``, and ``list``, ``tuple``, ``dict``
    (string keys) and ``set``/``frozenset`` of these. Anything else raises
    :class:`MessageFormatError` at set time; reading builds a new value each time.
    """

    __slots__ = ("_data",)
    kind = "object"

    def __init__(self, obj: Any = None) -> None:
        super().__init__()
        self._data: bytes | None = None
        if obj is not None:
            self.object = obj

    @property
    def object(self) -> Any:
        return None if self._data is None else _decode_object(json.loads(self._data))

    @object.setter
    def object(self, value: Any) -> None:
        self._check_body_writable()
        self._data = None if value is None else json.dumps(_encode_object(value, 0), separators=(",", ":")).encode()

    def _clear_body(self) -> None:
        self._data = None

    def _body_snapshot(self) -> Any:
        return self._data

    def _set_body_from(self, body: Any) -> None:
        self._data = body


_MAX_OBJECT_DEPTH = 100


def _encode_object(value: Any, depth: int) -> Any:
    if depth > _MAX_OBJECT_DEPTH:
        raise MessageFormatError(f"object body nested deeper than {_MAX_OBJECT_DEPTH} levels")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$f": repr(float(value))}
    if t is bytes or t is bytearray:
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if t is decimal.Decimal:
        return {"$d": str(value)}
    if t is _dt.datetime:
        return {"$dt": value.isoformat()}
    if t is _dt.date:
        return {"$date": value.isoformat()}
    if t is list:
        return [_encode_object(v, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [_encode_object(v, depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"$s": [_encode_object(v, depth + 1) for v in value]}
    if t is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise MessageFormatError(f"object body: dict keys must be str, got {type(key).__name__}")
            out[key] = _encode_object(item, depth + 1)
        return {"$m": out} if any(k.startswith("$") for k in out) or len(out) == 1 else out
    raise MessageFormatError(
        f"object body: {t.__name__} is not allowed (allowed: None, bool, int, float, str, bytes, Decimal, date, "
        "datetime, list, tuple, dict with str keys, set)"
    )


def _decode_object(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_object(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            ((tag, inner),) = value.items()
            if tag == "$f":
                return float(inner)
            if tag == "$b":
                return base64.b64decode(inner)
            if tag == "$d":
                return decimal.Decimal(inner)
            if tag == "$dt":
                return _dt.datetime.fromisoformat(inner)
            if tag == "$date":
                return _dt.date.fromisoformat(inner)
            if tag == "$t":
                return tuple(_decode_object(v) for v in inner)
            if tag == "$s":
                return set(_decode_object(v) for v in inner)
            if tag == "$m":
                return {k: _decode_object(v) for k, v in inner.items()}
        return {k: _decode_object(v) for k, v in value.items()}
    return value
