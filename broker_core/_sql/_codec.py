"""Envelopes to table rows and back.

Properties are JSON; values whose JMS type JSON cannot carry (byte, short,
int, float, char, bytes) are tagged ``{"\\u0000": [code, value]}`` so they read
back with their exact type. Bodies are bytes: UTF-8 text, tagged JSON for map
and stream bodies, raw bytes otherwise.

A body of at least ``compress_over`` bytes so encoded is stored as an LZ4
frame (the standard format: ``lz4 -d`` reads it) when that makes it smaller,
and its ``kind`` column then says so with :data:`COMPRESSED` (``"xml+lz4"``).
XML and other text shrink several times over, quickly both ways: several such
rows share a 16 KB SQLite page where each raw one took a page of its own, and every page is written twice
(to the WAL, then back into the database at the checkpoint). Rows of either
form read back the same.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import lz4.frame

from .._destinations import parse_destination
from .._envelope import Byte, Envelope, Float, Int, Short
from .._message import Char
from ..compression import lz4_frame

_TAG = "\u0000"
_ESCAPED_TAG = "\\u0000"  # how json.dumps writes the tag
_CODES = {Byte: "b", Short: "s", Int: "i", Float: "f", Char: "c"}
#: Suffix of the ``kind`` of a row whose body is an LZ4 frame.
COMPRESSED = "+lz4"
#: Bodies at least this long (encoded) are compressed by default: shorter ones share their page with
#: other rows anyway.
COMPRESS_OVER = 2048
_compress = lz4_frame
_decompress = lz4.frame.decompress
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


#: ``json.dumps(..., separators=(",", ":"))`` makes an encoder per call: as costly as the encoding of a row's
#: properties itself, in the store's writer thread
_compact = json.JSONEncoder(separators=(",", ":")).encode


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
        return _compact(props)
    return _compact({k: _encode_value(v) for k, v in props.items()})


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
        return _compact({k: _encode_value(v) for k, v in body.items()}).encode()
    if kind == "stream":
        return _compact([_encode_value(v) for v in body]).encode()
    return body  # bytes, object: already bytes


def stored_body(
    kind: str, body: Any, compress_over: int = COMPRESS_OVER, encoded: bytes | None = None
) -> tuple[str, bytes | None]:
    """The ``kind`` and ``body`` columns of a body (*encoded*: its encoding, known already): compressed
    (see the module docstring) when it is at least ``compress_over`` bytes (0: never) and compression
    saves at least an eighth."""
    data = encoded if encoded is not None else encode_body(kind, body)
    if compress_over and data is not None and len(data) >= compress_over:
        packed = _compress(data)
        if len(packed) <= len(data) - (len(data) >> 3):
            return kind + COMPRESSED, packed
    return kind, data


def read_body(kind: str, data: bytes | None) -> tuple[str, Any]:
    """The message kind and body of a row's ``kind`` and ``body`` columns (either form)."""
    if kind.endswith(COMPRESSED):
        kind = kind[: -len(COMPRESSED)]
        if data is not None:
            data = _decompress(data)
    return kind, decode_body(kind, data)


def decode_body(kind: str, data: bytes | None) -> Any:
    """The body of a message of this (uncompressed) kind from its encoded bytes."""
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


def message_values(env: Envelope, row_id: int, compress_over: int = COMPRESS_OVER) -> tuple[Any, ...]:
    """The ``b2b_messages`` insert parameters of ``env``, in
    ``("id", *MESSAGE_COLUMNS)`` order (the hot path: no dict per row)."""
    reply_to = env.reply_to
    kind, body = stored_body(env.kind, env.body, compress_over, env.encoded)
    return (
        row_id,
        env.message_id,
        str(env.destination),
        env.delivery_mode,
        env.timestamp,
        env.correlation_id,
        None if reply_to is None else str(reply_to),
        env.type,
        encode_properties(env.properties),
        kind,
        body,
        env.origin,
    )


#: The b2b_messages columns an envelope is rebuilt from (with the entry's
#: priority and expiration).
MESSAGE_COLUMNS = (
    "message_id",
    "destination",
    "delivery_mode",
    "timestamp",
    "correlation_id",
    "reply_to",
    "type",
    "properties",
    "kind",
    "body",
    "origin",
)


def row_envelope(row: Any, priority: int, expiration: int, at: int = 0) -> Envelope:
    """Rebuild an envelope from the MESSAGE_COLUMNS values of a
    ``b2b_messages`` row, starting at index ``at`` of ``row``."""
    (message_id, dest, delivery_mode, timestamp, correlation_id, reply_to, type_, properties, kind, body, origin) = row[
        at : at + 11
    ]
    kind, body = read_body(kind, body)
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
        body,
        origin,
    )
