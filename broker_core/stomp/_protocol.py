"""What a STOMP client did wrong, and how an error is titled in an ERROR frame."""

from __future__ import annotations

__all__ = ["ProtocolError", "error_title"]


class ProtocolError(Exception):
    """A client mistake: becomes an ERROR frame (``message`` header, ``detail``
    body) and the connection closes."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail or message


def error_title(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".split("\n", 1)[0][:200]
