"""Answers that carry a stored document or reply as it was received: never run by a browser.

A partner chooses every byte of its documents, and XML can hold XHTML with ``<script>`` (UBL's
``ext:ExtensionContent`` takes any content). Served as ``application/xml`` on the console's origin, such a
document would run its script with an operator's session. Every answer that returns stored bytes therefore
says: download it (``Content-Disposition: attachment``), do not guess another type (``X-Content-Type-Options:
nosniff``), and, should a browser render it anyway, load nothing and run nothing in a unique origin
(``Content-Security-Policy: default-src 'none'; sandbox``).
"""

from __future__ import annotations

import re

from starlette.responses import Response

__all__ = ["RAW_DOCUMENT_HEADERS", "raw_document_response", "raw_mdn_response"]

#: The headers every raw document answer carries (besides its Content-Disposition).
RAW_DOCUMENT_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cache-Control": "no-store",
}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def attachment(name: str, extension: str = ".xml") -> str:
    """A ``Content-Disposition: attachment`` value with a file name made only of safe characters."""
    safe = _UNSAFE.sub("_", name).strip("._")[:120] or "document"
    return f'attachment; filename="{safe}{extension}"'


def raw_document_response(data: bytes, filename: str, headers: dict[str, str] | None = None) -> Response:
    """*data* (stored XML) as an attachment that no browser runs."""
    return Response(
        data,
        media_type="application/xml; charset=utf-8",
        headers={**RAW_DOCUMENT_HEADERS, "Content-Disposition": attachment(filename), **(headers or {})},
    )


def raw_mdn_response(data: bytes, filename: str) -> Response:
    """An AS2 MDN (a MIME entity, byte for byte as sent or received) as an attachment that no browser runs."""
    return Response(
        data,
        media_type="message/rfc822",
        headers={**RAW_DOCUMENT_HEADERS, "Content-Disposition": attachment(filename, ".eml")},
    )
