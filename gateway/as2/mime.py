"""A bounded MIME reader for AS2 (RFC 2045, RFC 2046), keeping each part's exact bytes.

A signature covers a part's bytes as sent (headers included) and the MIC is computed over them, so parts are
cut out of the message rather than re-serialised as ``email`` would. Everything is bounded: the header block's
size and count, the parts of a multipart, and (by the caller) the nesting depth.
"""

from __future__ import annotations

import base64
import binascii
import quopri
from dataclasses import dataclass
from email.message import Message

from gateway.as2.errors import As2MimeError

__all__ = ["MimeLimits", "Part", "content_type", "entity", "split_multipart"]


@dataclass(frozen=True, slots=True)
class MimeLimits:
    """Bounds of one message's MIME structure."""

    header_bytes: int = 16 * 1024  # one part's header block
    headers: int = 64  # header fields in one part
    parts: int = 8  # body parts of one multipart (AS2 needs two or three)
    depth: int = 6  # unwrapping steps: encrypted, compressed, signed, ...


@dataclass(slots=True)
class Part:
    """One MIME entity: its header fields (names in lower case), its body as sent and its whole bytes."""

    headers: list[tuple[str, str]]
    body: bytes
    raw: bytes

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def content_type(self) -> tuple[str, dict[str, str]]:
        return content_type(self.header("content-type"))

    def decoded(self) -> bytes:
        """The body with its Content-Transfer-Encoding undone."""
        encoding = (self.header("content-transfer-encoding") or "binary").strip().lower()
        if encoding == "base64":
            try:
                return base64.b64decode(b"".join(self.body.split()), validate=True)
            except (binascii.Error, ValueError):
                raise As2MimeError("A base64 part is not valid base64.") from None
        if encoding == "quoted-printable":
            return quopri.decodestring(self.body)
        if encoding in ("binary", "8bit", "7bit"):
            return self.body
        raise As2MimeError(f"Content-Transfer-Encoding {encoding[:40]!r} is not supported.")


def content_type(value: str | None) -> tuple[str, dict[str, str]]:
    """The media type (lower case) and parameters of a Content-Type value."""
    if not value:
        return "text/plain", {}
    message = Message()
    message["content-type"] = value
    params = {k.lower(): v if isinstance(v, str) else str(v) for k, v in (message.get_params() or [])[1:]}
    return message.get_content_type(), params


def _header_block(data: bytes, limits: MimeLimits) -> tuple[list[tuple[str, str]], int]:
    """The header fields at the start of *data* and where the body starts."""
    end, sep = -1, 0
    for marker in (b"\r\n\r\n", b"\n\n"):
        at = data.find(marker, 0, limits.header_bytes + len(marker))
        if at != -1 and (end == -1 or at < end):
            end, sep = at, len(marker)
    if end == -1:
        if data.startswith((b"\r\n", b"\n")):  # no header fields at all
            return [], 2 if data.startswith(b"\r\n") else 1
        raise As2MimeError(f"A MIME part's headers are longer than {limits.header_bytes} bytes or never end.")
    text = data[:end].decode("latin-1").replace("\r\n", "\n")
    headers: list[tuple[str, str]] = []
    for line in text.split("\n"):
        if line[:1] in (" ", "\t") and headers:  # folded
            name, value = headers[-1]
            headers[-1] = (name, value + " " + line.strip())
            continue
        name, colon, value = line.partition(":")
        if not colon or not name.strip() or " " in name.strip():
            raise As2MimeError("A MIME header line is malformed.")
        headers.append((name.strip().lower(), value.strip()))
        if len(headers) > limits.headers:
            raise As2MimeError(f"A MIME part has more than {limits.headers} header fields.")
    return headers, end + sep


def entity(data: bytes, limits: MimeLimits) -> Part:
    """Parse *data* (a MIME entity: headers, blank line, body)."""
    headers, start = _header_block(data, limits)
    return Part(headers, data[start:], data)


def split_multipart(part: Part, limits: MimeLimits) -> list[Part]:
    """The body parts of a multipart *part* (each with its exact bytes, the delimiters' line breaks left out)."""
    _, params = part.content_type
    boundary = params.get("boundary")
    if not boundary or len(boundary) > 70:
        raise As2MimeError("A multipart has no boundary (or one longer than RFC 2046's 70 characters).")
    body = part.body
    delimiter = b"--" + boundary.encode("latin-1")
    positions = []
    at = 0
    while True:
        at = body.find(delimiter, at)
        if at == -1:
            break
        if at == 0 or body[at - 1 : at] == b"\n":
            positions.append(at)
            if body[at + len(delimiter) : at + len(delimiter) + 2] == b"--":
                break
            if len(positions) > limits.parts + 1:
                raise As2MimeError(f"A multipart has more than {limits.parts} parts.")
        at += len(delimiter)
    if len(positions) < 2 or body[positions[-1] + len(delimiter) : positions[-1] + len(delimiter) + 2] != b"--":
        raise As2MimeError("A multipart is not closed by its final boundary.")
    parts = []
    for start, end in zip(positions, positions[1:], strict=False):
        line_end = body.find(b"\n", start)
        if line_end == -1 or line_end >= end:
            raise As2MimeError("A multipart boundary line is malformed.")
        content_start = line_end + 1
        content_end = end - 1  # the LF before the next delimiter
        if body[content_end - 1 : content_end] == b"\r":
            content_end -= 1
        parts.append(entity(body[content_start : max(content_start, content_end)], limits))
    return parts
