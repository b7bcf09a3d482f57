"""What the ledger keeps of a received body: its document (without a UTF-8 byte order mark) and its digest."""

from __future__ import annotations

import codecs
import hashlib

__all__ = ["document_digest", "received_document"]


def document_digest(body: bytes) -> str:
    """The ledger's digest of a request body as received (the prefix names the algorithm).

    SHA-256 rather than BLAKE2: with the CPU's SHA instructions, which OpenSSL uses, it is the faster."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def received_document(body: bytes) -> bytes:
    """The ledger's document of a body received in UTF-8: the body without its byte order mark."""
    return body[3:] if body.startswith(codecs.BOM_UTF8) else body
