"""Messages on the pipes between the serving process and its helper processes, read with size caps and
against deadlines: a helper that parsed hostile bytes is trusted with nothing unbounded.

Two framings:

* a *frame*: an 8-byte header (the JSON part's length, then the byte string's, big-endian), the JSON part,
  then the byte string (a document, an answer's byte strings); :func:`write_frame`, :func:`read_frame`,
  :func:`take_frame` (from a buffer filled by non-blocking reads);
* a *record*: a 4-byte big-endian length, then that many bytes; :func:`write_record`, :func:`read_record`,
  :func:`pack_record`, :func:`take_record`.
"""

from __future__ import annotations

import json
import os
import select
import struct
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "FRAME",
    "RECORD",
    "pack_record",
    "read_exactly",
    "read_frame",
    "read_record",
    "take_frame",
    "take_record",
    "write_all",
    "write_frame",
    "write_record",
]

#: A frame's header: the JSON part's length, then the byte string's.
FRAME = struct.Struct(">II")
#: A record's header: its length.
RECORD = struct.Struct(">I")


def write_all(fd: int, data: bytes) -> None:
    """Write all of *data* to *fd* (a pipe takes at most its buffer per write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    """*size* bytes from *fd*; TimeoutError once ``time.monotonic()`` passes *deadline* (None: no
    deadline), EOFError when the other end closes first."""
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError()
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError()
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------- frames: JSON and bytes


def write_frame(fd: int, head: Any, payload: bytes = b"", *, default: Callable[[Any], Any] | None = None) -> None:
    """Write the frame of *head* (JSON; *default* as :func:`json.dumps` takes it) and *payload* to *fd*."""
    data = json.dumps(head, separators=(",", ":"), default=default).encode("utf-8")
    write_all(fd, FRAME.pack(len(data), len(payload)) + data)
    if payload:
        write_all(fd, payload)  # not joined to the header: a copy of megabytes, under the interpreter lock


def read_frame(fd: int, deadline: float | None = None, *, max_head: int, max_payload: int | None) -> tuple[Any, bytes]:
    """A frame from *fd*: its JSON part and its byte string. ValueError for a frame over *max_head* or
    *max_payload* (None: no cap) or a JSON part that is not JSON; TimeoutError and EOFError as
    :func:`read_exactly` raises them."""
    head_len, payload_len = FRAME.unpack(read_exactly(fd, FRAME.size, deadline))
    if head_len > max_head or max_payload is not None and payload_len > max_payload:
        raise ValueError(f"a frame of {head_len} + {payload_len} bytes is over the limit")
    head = json.loads(read_exactly(fd, head_len, deadline))
    return head, read_exactly(fd, payload_len, deadline) if payload_len else b""


def take_frame(buffer: bytearray, *, max_head: int, max_payload: int) -> tuple[bytes, bytes] | None:
    """The first frame in *buffer* (its JSON part undecoded, and its byte string), removed from it; None while
    it is incomplete, or when it is over *max_head* or *max_payload* (then it stays in the buffer)."""
    if len(buffer) < FRAME.size:
        return None
    head_len, payload_len = FRAME.unpack_from(buffer)
    end = FRAME.size + head_len + payload_len
    if head_len > max_head or payload_len > max_payload or len(buffer) < end:
        return None
    head = bytes(buffer[FRAME.size : FRAME.size + head_len])
    payload = bytes(buffer[FRAME.size + head_len : end])
    del buffer[:end]
    return head, payload


# --------------------------------------------------------------------------- records: length and bytes


def pack_record(payload: bytes) -> bytes:
    """The record of *payload*, to be written whole (by non-blocking writes, say)."""
    return RECORD.pack(len(payload)) + payload


def write_record(fd: int, payload: bytes) -> None:
    write_all(fd, pack_record(payload))


def read_record(fd: int, deadline: float | None = None) -> bytes:
    """A record's bytes from *fd*; TimeoutError and EOFError as :func:`read_exactly` raises them."""
    (size,) = RECORD.unpack(read_exactly(fd, RECORD.size, deadline))
    return read_exactly(fd, size, deadline)


def take_record(buffer: bytearray | bytes) -> bytes | None:
    """The bytes of the first record in *buffer* (which is left as it is), or None while it is incomplete."""
    if len(buffer) < RECORD.size:
        return None
    (size,) = RECORD.unpack_from(buffer)
    if len(buffer) < RECORD.size + size:
        return None
    return bytes(buffer[RECORD.size : RECORD.size + size])
