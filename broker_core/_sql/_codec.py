"""Envelopes to table rows and back.

Properties are JSON; values whose JMS type JSON cannot carry (byte, short,
int, float, char, bytes) are tagged ``{"\\u0000": [code, value]}`` so they read
back with their exact type. Bodies are bytes: UTF-8 text, tagged JSON for map
and stream bodies, raw bytes otherwise.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from .._destinations import parse_destination
from .._envelope import Byte, Envelope, Float, Int, Short
from .._message import Char

_TAG = "\u0000"
_ESCAPED_TAG = "\\u0000"  # how json.dumps writes the tag
_CODES = {Byte: "b", Short: "s", Int: "i", Float: "f", Char: "c"}
_TYPES = {code: cls for cls, code in _CODES.items()}


def _encode_value(value: Any) -> Any:
    cls = type(value)
    code = _CODES.get(cls)
    if code is not None:
        return {_TAG: [code, float(value) if cls is Float else (str(value) if cls is Char else int(value))]}
    if cls is bytes:
        return {_TAG: ["y", base64.b64encode(value).decode("ascii")]}
    return value


def _decode_value(value: Any) -> Any:
    if type(value) is dict:
        code, inner = value[_TAG]
        if code == "y":
            return base64.b64decode(inner)
        return _TYPES[code](inner)
    return value


def encode_properties(props: dict[str, Any]) -> str:
    if not props:
        return "{}"
    plain = True
    for value in props.values():
        cls = type(value)
        if cls is not str and cls is not int and cls is not float and cls is not bool:
            plain = False
            break
    if plain:
        return json.dumps(props, separators=(",", ":"))
    return json.dumps({k: _encode_value(v) for k, v in props.items()}, separators=(",", ":"))


def decode_properties(text: str) -> dict[str, Any]:
    if text == "{}":
        return {}
    props = json.loads(text)
    if _ESCAPED_TAG in text:
        return {k: _decode_value(v) for k, v in props.items()}
    return props


def encode_body(kind: str, body: Any) -> bytes | None:
    if body is None:
        return None
    if kind == "text" or kind == "xml":
        return body.encode("utf-8")
    if kind == "map":
        return json.dumps({k: _encode_value(v) for k, v in body.items()}, separators=(",", ":")).encode()
    if kind == "stream":
        return json.dumps([_encode_value(v) for v in body], separators=(",", ":")).encode()
    return body  # bytes, object: already bytes


def decode_body(kind: str, data: bytes | None) -> Any:
    if data is None:
        return None
    if kind == "text" or kind == "xml":
        return bytes(data).decode("utf-8")
    if kind == "map":
        return {k: _decode_value(v) for k, v in json.loads(data).items()}
    if kind == "stream":
        return tuple(_decode_value(v) for v in json.loads(data))
    return bytes(data)


_destinations: dict[str, Any] = {}


def destination(text: str | None) -> Any:
    """Parse a stored destination, caching the few distinct ones."""
    if text is None:
        return None
    found = _destinations.get(text)
    if found is None:
        found = parse_destination(text)
        if len(_destinations) < 10_000:
            _destinations[text] = found
    return found


def message_values(env: Envelope, row_id: int) -> tuple[Any, ...]:
    """The ``b2b_messages`` insert parameters of ``env``, in
    ``("id", *MESSAGE_COLUMNS)`` order (the hot path: no dict per row)."""
    reply_to = env.reply_to
    return (row_id, env.message_id, str(env.destination), env.delivery_mode, env.timestamp, env.correlation_id,
            None if reply_to is None else str(reply_to), env.type, encode_properties(env.properties), env.kind,
            encode_body(env.kind, env.body), env.origin)


#: The b2b_messages columns an envelope is rebuilt from (with the entry's
#: priority and expiration).
MESSAGE_COLUMNS = ("message_id", "destination", "delivery_mode", "timestamp", "correlation_id", "reply_to", "type",
                   "properties", "kind", "body", "origin")


def row_envelope(row: Any, priority: int, expiration: int, at: int = 0) -> Envelope:
    """Rebuild an envelope from the MESSAGE_COLUMNS values of a
    ``b2b_messages`` row, starting at index ``at`` of ``row``."""
    (message_id, dest, delivery_mode, timestamp, correlation_id, reply_to, type_, properties, kind, body,
     origin) = row[at:at + 11]
    return Envelope(
        message_id,
        destination(dest),
        delivery_mode,
        priority,
        expiration,
        timestamp,
        correlation_id,
        destination(reply_to),
        type_,
        decode_properties(properties),
        kind,
        decode_body(kind, body),
        origin,
    )
