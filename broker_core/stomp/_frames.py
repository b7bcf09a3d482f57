"""STOMP frames: an incremental parser and an encoder (STOMP 1.0, 1.1, 1.2).

``FrameParser.feed(data)`` takes whatever bytes a TCP read returned and gives
back the complete frames they finish, keeping the rest for the next read. It
accepts ``\\n`` or ``\\r\\n`` line ends, skips heart-beat EOLs between frames,
unescapes header values as the negotiated version says (1.2: ``\\r \\n \\c
\\\\``; 1.1: ``\\n \\c \\\\``; 1.0 and CONNECT/CONNECTED frames: none), honours
``content-length`` (binary bodies with NULs) and otherwise reads the body up to
the NUL. Any violation, including a limit exceeded, raises :class:`FrameError`
and the parser is unusable afterwards (the connection must close).
"""

from __future__ import annotations

import re

__all__ = [
    "Frame",
    "FrameError",
    "FrameParser",
    "encode",
    "escape",
    "unescape",
    "CLIENT_COMMANDS",
    "SERVER_COMMANDS",
    "HEARTBEAT",
]

CLIENT_COMMANDS = frozenset(
    {"CONNECT", "STOMP", "SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT", "DISCONNECT"}
)
SERVER_COMMANDS = frozenset({"CONNECTED", "MESSAGE", "RECEIPT", "ERROR"})
#: Frames whose headers are never escaped (for compatibility with 1.0 peers).
_RAW_HEADER_COMMANDS = frozenset({"CONNECT", "STOMP", "CONNECTED"})

HEARTBEAT = b"\n"

DEFAULT_MAX_HEADERS = 1000
DEFAULT_MAX_HEADER_BYTES = 64 * 1024  # the whole command + header block
DEFAULT_MAX_FRAME_SIZE = 10 * 1024 * 1024  # body


class FrameError(Exception):
    """A frame that breaks the protocol or a configured limit. The message
    says what was wrong; the connection cannot continue after it."""


class Frame:
    """A STOMP frame: ``command``, ``headers`` (first occurrence of a repeated
    header wins, as the spec says) and ``body`` bytes."""

    __slots__ = ("command", "headers", "body")

    def __init__(self, command: str, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.command = command
        self.headers = headers if headers is not None else {}
        self.body = body

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Frame)
            and other.command == self.command
            and other.headers == self.headers
            and other.body == self.body
        )

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 40 else self.body[:40] + b"..."
        return f"Frame({self.command!r}, {self.headers!r}, {body!r})"


# ---------------------------------------------------------------- escaping

_UNESC_12 = {"\\\\": "\\", "\\r": "\r", "\\n": "\n", "\\c": ":"}
_UNESC_11 = {"\\\\": "\\", "\\n": "\n", "\\c": ":"}
_UNESC_RE = re.compile(r"\\.?", re.S)


def escape(value: str, version: str) -> str:
    """Escape a header name or value for ``version``. STOMP 1.0 has no
    escapes: line breaks (which would end the header) become spaces.
    (``str.replace`` in turn, the backslash first: a sixth of a regular
    expression's cost, on every message id of every MESSAGE frame.)"""
    if version == "1.2" or version == "1.1":
        if "\\" in value:
            value = value.replace("\\", "\\\\")
        if ":" in value:
            value = value.replace(":", "\\c")
        if "\n" in value:
            value = value.replace("\n", "\\n")
        if "\r" in value and version == "1.2":  # 1.1 has no escape for it
            value = value.replace("\r", "\\r")
        return value
    return value.replace("\r", " ").replace("\n", " ")


def unescape(value: str, version: str) -> str:
    """Undo :func:`escape`; an undefined escape sequence raises FrameError."""
    if "\\" not in value or version == "1.0":
        return value
    table = _UNESC_12 if version == "1.2" else _UNESC_11

    def sub(match: re.Match[str]) -> str:
        seq = match.group()
        try:
            return table[seq]
        except KeyError:
            raise FrameError(
                f"invalid escape sequence {seq!r} in header {value!r} (STOMP {version} allows "
                f"{', '.join(sorted(table))})"
            ) from None

    return _UNESC_RE.sub(sub, value)


# ---------------------------------------------------------------- encoding


def encode(frame: Frame, version: str = "1.2") -> bytes:
    """The bytes of ``frame`` for a peer speaking ``version``. A
    ``content-length`` header is written as given (callers add it for binary
    bodies)."""
    command = frame.command
    lines = [command]
    if command in _RAW_HEADER_COMMANDS:
        for name, value in frame.headers.items():
            lines.append(f"{name}:{value}")
    else:
        for name, value in frame.headers.items():
            lines.append(f"{escape(name, version)}:{escape(str(value), version)}")
    lines.append("\n")
    return "\n".join(lines).encode("utf-8") + frame.body + b"\0"


# ---------------------------------------------------------------- parsing


class FrameParser:
    """Incremental STOMP frame parser; see the module docstring.

    ``version`` selects header unescaping; the server sets it once CONNECT is
    negotiated (before that, frames are parsed as 1.2 except CONNECT/STOMP,
    whose headers are never unescaped).
    """

    def __init__(
        self,
        version: str = "1.2",
        *,
        max_headers: int = DEFAULT_MAX_HEADERS,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self.version = version
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0  # start of the unparsed data in _buf
        self._head: tuple[Frame, int, int | None] | None = None  # parsed head, body start, content length
        self._scan = 0  # where to resume looking for the NUL of a body without content-length
        self._failed: FrameError | None = None
        #: heart-beat EOLs seen (the server counts any byte as a sign of life anyway)
        self.heartbeats = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """Add received bytes; return the frames now complete (maybe none)."""
        if self._failed is not None:
            raise self._failed
        if data:
            self._buf += data
        frames: list[Frame] = []
        try:
            while True:
                frame = self._next()
                if frame is None:
                    break
                frames.append(frame)
        except FrameError as error:
            self._failed = error
            raise
        # compact the buffer once the consumed prefix is large
        if self._pos and (self._pos > 65536 or self._pos == len(self._buf)):
            del self._buf[: self._pos]
            if self._head is not None:
                frame, start, length = self._head
                self._head = (frame, start - self._pos, length)
            self._scan = max(0, self._scan - self._pos)
            self._pos = 0
        return frames

    def _next(self) -> Frame | None:
        buf = self._buf
        if self._head is None:
            # skip heart-beats (EOLs) between frames
            pos = self._pos
            end = len(buf)
            while pos < end:
                c = buf[pos]
                if c == 10:
                    self.heartbeats += 1
                    pos += 1
                elif c == 13:
                    if pos + 1 >= end:
                        break  # wait for the \n of \r\n
                    if buf[pos + 1] != 10:
                        raise FrameError("a lone carriage return between frames (expected \\r\\n)")
                    self.heartbeats += 1
                    pos += 2
                else:
                    break
            self._pos = pos
            if pos >= end:
                return None
            head_end = buf.find(b"\n\n", pos)
            crlf_end = buf.find(b"\n\r\n", pos, head_end + 3 if head_end >= 0 else len(buf))
            if crlf_end >= 0:
                head_end, body_start = crlf_end, crlf_end + 3
            elif head_end >= 0:
                body_start = head_end + 2
            else:
                if end - pos > self.max_header_bytes:
                    raise FrameError(f"frame command and headers exceed {self.max_header_bytes} bytes")
                return None
            if head_end - pos > self.max_header_bytes:
                raise FrameError(f"frame command and headers exceed {self.max_header_bytes} bytes")
            frame, length = self._parse_head(bytes(buf[pos:head_end]))
            self._head = (frame, body_start, length)
            self._scan = body_start
        frame, body_start, length = self._head
        if length is not None:
            end = body_start + length
            if len(buf) <= end:
                return None
            if buf[end] != 0:
                raise FrameError(f"the body is longer than its content-length ({length}): no NUL after {length} bytes")
            frame.body = bytes(buf[body_start:end])
        else:
            nul = buf.find(b"\0", self._scan)
            if nul < 0:
                self._scan = len(buf)
                if len(buf) - body_start > self.max_frame_size:
                    raise FrameError(
                        f"frame body exceeds the maximum frame size of {self.max_frame_size} bytes "
                        "(or its NUL terminator is missing)"
                    )
                return None
            if nul - body_start > self.max_frame_size:
                raise FrameError(f"frame body exceeds the maximum frame size of {self.max_frame_size} bytes")
            end = nul
            frame.body = bytes(buf[body_start:end])
        self._pos = end + 1
        self._head = None
        return frame

    def _parse_head(self, raw: bytes) -> tuple[Frame, int | None]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FrameError(f"frame command or headers are not UTF-8: {error}") from None
        lines = text.split("\n")
        command = lines[0]
        if command.endswith("\r"):
            command = command[:-1]
        if not command or not command.isascii() or not command.isalpha():
            raise FrameError(f"invalid frame command {command[:40]!r}")
        if len(lines) - 1 > self.max_headers:
            raise FrameError(f"frame has {len(lines) - 1} headers; at most {self.max_headers} are allowed")
        raw_headers = command in _RAW_HEADER_COMMANDS
        version = self.version
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line.endswith("\r"):
                line = line[:-1]
            name, sep, value = line.partition(":")
            if not sep:
                raise FrameError(f"header line without a colon: {line[:80]!r}")
            if not raw_headers and version != "1.0":
                name = unescape(name, version)
                value = unescape(value, version)
            if name not in headers:
                headers[name] = value
        length: int | None = None
        cl = headers.get("content-length")
        if cl is not None:
            cl = cl.strip()
            if not cl.isdigit() or not cl.isascii():
                raise FrameError(f"content-length must be a non-negative integer, got {cl[:40]!r}")
            length = int(cl)
            if length > self.max_frame_size:
                raise FrameError(
                    f"content-length {length} exceeds the maximum frame size of {self.max_frame_size} bytes"
                )
        return Frame(command, headers), length
