"""Text bodies: :class:`TextMessage`, and :class:`XMLMessage`, whose text is
an XML document parsed on demand (hardened parser)."""

from __future__ import annotations

from typing import Any

from lxml import etree

from .._envelope import hardened_xml_parser
from .._errors import MessageFormatError
from .base import Message


class TextMessage(Message):
    """A message whose body is a string, read and written as ``text``."""

    __slots__ = ("_text",)
    kind = "text"

    def __init__(self, text: str | None = None) -> None:
        super().__init__()
        self._text = None
        if text is not None:
            self.text = text

    @property
    def text(self) -> str | None:
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._check_body_writable()
        if value is not None and not isinstance(value, str):
            raise MessageFormatError(f"text must be a str or None, got {type(value).__name__}")
        self._text = value

    def _clear_body(self) -> None:
        self._text = None

    def _body_snapshot(self) -> Any:
        return self._text

    def _set_body_from(self, body: Any) -> None:
        self._text = body


_XML_PARSER = hardened_xml_parser()


class XMLMessage(TextMessage):
    """A text message whose text is an XML document.

    ``document()`` parses it on first use with a hardened parser (no DTD, no
    entity expansion, no network) and returns the root element.

    *utf8*, when the caller has it at hand (the document as received), is the
    text's UTF-8 encoding, exactly ``text.encode("utf-8")``: a persistent send
    stores those bytes instead of encoding the text again (for a large
    document with non-ASCII letters, not free). Setting ``text`` later drops them.
    """

    __slots__ = ("_doc", "_utf8")
    kind = "xml"

    def __init__(self, text: str | None = None, *, utf8: bytes | None = None) -> None:
        self._doc = None
        self._utf8 = None
        super().__init__(text)
        if utf8 is not None:
            if text is None or not isinstance(utf8, bytes):
                raise MessageFormatError("utf8 must be the bytes of the text given with it")
            self._utf8 = utf8

    @TextMessage.text.setter  # type: ignore[attr-defined]
    def text(self, value: str | None) -> None:
        TextMessage.text.fset(self, value)  # type: ignore[attr-defined]
        self._doc = None
        self._utf8 = None

    def _body_encoded(self) -> bytes | None:
        return self._utf8

    def _set_body_from(self, body: Any) -> None:
        self._text = body
        self._doc = None
        self._utf8 = None

    def _clear_body(self) -> None:
        self._text = None
        self._doc = None
        self._utf8 = None

    def document(self) -> etree._Element:
        """The root element of the XML body; :class:`MessageFormatError` if the
        text is not well-formed XML."""
        if self._doc is None:
            if self._text is None:
                raise MessageFormatError("the message has no XML body")
            try:
                data = self._utf8 if self._utf8 is not None else self._text.encode("utf-8")
                self._doc = etree.fromstring(data, _XML_PARSER)
            except (etree.XMLSyntaxError, ValueError) as exc:
                raise MessageFormatError(f"the body is not well-formed XML: {str(exc)[:300]}") from None
        return self._doc
