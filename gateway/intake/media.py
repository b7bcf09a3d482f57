"""The request's media type: ``application/xml``, ``text/xml`` or ``application/*+xml``, and its charset."""

from __future__ import annotations

import re

from gateway.errors import (
    UnsupportedMediaTypeError,
    clip,
)
from gateway.intake.encodings import _SUPPORTED_TEXT, SUPPORTED_ENCODINGS, _lookup_encoding
from gateway.intake.limits import ACCEPTED_MEDIA_TYPES

# --------------------------------------------------------------------------- media type

_XML_SUBTYPE = re.compile(r"^application/[a-z0-9!#$&^_.+-]+\+xml$")


_MEDIA_TYPES: dict[str, str | None] = {}  # accepted Content-Type values seen -> their charset
_MEDIA_TYPES_MAX = 256


def check_media_type(content_type: str | None) -> str | None:
    """Check a ``Content-Type`` header value; return its charset, if any.

    Accepts ``application/xml``, ``text/xml`` and ``application/*+xml``
    (``application/ubl+xml``...), case-insensitively, with parameters. Returns
    the ``charset`` parameter as the canonical name of a supported encoding
    (``"UTF-8"``, ``"ISO-8859-1"``...) or ``None`` when there is none. Raises
    :class:`~gateway.errors.UnsupportedMediaTypeError`, naming what was
    received and what is accepted, for a missing or other media type or a
    charset that is not supported.
    """
    if content_type in _MEDIA_TYPES:  # the few values clients send, checked once each
        return _MEDIA_TYPES[content_type]
    charset = _check_media_type(content_type)
    if len(_MEDIA_TYPES) < _MEDIA_TYPES_MAX:
        _MEDIA_TYPES[content_type] = charset  # type: ignore[index]  # None never gets here: it raises
    return charset


def _check_media_type(content_type: str | None) -> str | None:
    accepted = ", ".join(ACCEPTED_MEDIA_TYPES)
    if content_type is None or not content_type.strip():
        raise UnsupportedMediaTypeError(
            f"The request has no Content-Type; send the document as one of: {accepted}.",
            received=None,
        )
    shown = clip(content_type.strip(), 100)
    media_type, _, params = content_type.partition(";")
    media_type = media_type.strip().lower()
    if media_type not in ("application/xml", "text/xml") and not _XML_SUBTYPE.match(media_type):
        raise UnsupportedMediaTypeError(
            f"Content-Type {shown!r} is not accepted; send the document as one of: {accepted} "
            "(a charset parameter is allowed).",
            received=content_type,
        )
    charset: str | None = None
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            value = value.strip().strip('"').strip()
            pyname = _lookup_encoding(value)
            if pyname is None:
                raise UnsupportedMediaTypeError(
                    f"Content-Type {shown!r} names charset {clip(value, 40)!r}, which this gateway does not "
                    f"decode; use UTF-8 (or {_SUPPORTED_TEXT}).",
                    received=content_type,
                )
            charset = SUPPORTED_ENCODINGS[pyname]
    return charset
