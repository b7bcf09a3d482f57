"""AS2's errors, in the gateway's hierarchy (:class:`gateway.errors.GatewayError`).

Two kinds: those answered with an HTTP problem before any MDN can be made (:class:`As2RequestError` and its
subclasses: missing headers, an unknown partner, an unsigned message from a partner who must sign), and those
answered with a negative MDN (:class:`As2ProcessingError`: its ``disposition`` is the RFC 4130 modifier after
``processed/error:``, its ``code`` what the MDN's human-readable part names).
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError

__all__ = [
    "As2AuthenticationError",
    "As2DecompressionError",
    "As2DecompressionLimitError",
    "As2DecryptionError",
    "As2Error",
    "As2HeaderError",
    "As2IntegrityError",
    "As2MimeError",
    "As2MdnError",
    "As2ProcessingError",
    "As2RequestError",
    "As2UnknownPartnerError",
    "As2UnsignedError",
]


class As2Error(GatewayError):
    """Base of the AS2 errors."""

    status = 400
    code = "as2-error"


class As2RequestError(As2Error):
    """Raised when an AS2 request is refused with an HTTP problem, before any MDN."""


class As2HeaderError(As2RequestError):
    """Raised when a required AS2 header (``AS2-From``, ``AS2-To``, ``Message-ID``) is missing or malformed."""

    code = "as2-header-invalid"
    default_detail = "Send AS2-From, AS2-To and Message-ID headers as RFC 4130 defines them."


class As2UnknownPartnerError(As2RequestError):
    """Raised when ``AS2-From`` names no configured partner or ``AS2-To`` is not our AS2 id: before any
    cryptography."""

    status = 403
    code = "as2-unknown-partner"
    default_detail = "This AS2 id pair is not configured here; agree on AS2 ids with the gateway's operator."


class As2UnsignedError(As2RequestError):
    """Raised when a partner whose agreement requires signed (or encrypted) messages sends a message that is
    not, as its top-level content type already shows: before any cryptography."""

    status = 403
    code = "as2-unprotected"
    default_detail = "Your agreement requires signed and encrypted AS2 messages."


class As2ProcessingError(As2Error):
    """Raised when a message is answered with a negative MDN; ``disposition`` is its RFC 4130 modifier."""

    disposition: ClassVar[str] = "unexpected-processing-error"
    code = "as2-processing-failed"


class As2DecryptionError(As2ProcessingError):
    """Raised when the message cannot be decrypted with our key or uses a cipher not allowed."""

    disposition = "decryption-failed"
    code = "as2-decryption-failed"


class As2AuthenticationError(As2ProcessingError):
    """Raised when the signature is missing, made with another certificate, with a digest not allowed, or
    the partner's certificate is not valid now."""

    disposition = "authentication-failed"
    code = "as2-authentication-failed"


class As2IntegrityError(As2ProcessingError):
    """Raised when the signed content does not match its signed digest (changed in transit)."""

    disposition = "integrity-check-failed"
    code = "as2-integrity-check-failed"


class As2DecompressionError(As2ProcessingError):
    """Raised when compressed content is malformed or uses another algorithm than zlib (RFC 5402)."""

    disposition = "decompression-failed"
    code = "as2-decompression-failed"


class As2DecompressionLimitError(As2DecompressionError):
    """Raised when compressed content inflates past the size limit (a decompression bomb): refused once that
    many bytes came out."""

    code = "as2-decompressed-too-large"

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"The compressed content inflates past the {limit} bytes accepted; send less.")


class As2MimeError(As2ProcessingError):
    """Raised when the MIME structure is malformed or over its bounds (nesting depth, parts, header sizes)."""

    code = "as2-mime-invalid"


class As2MdnError(As2Error):
    """Raised when an MDN we receive is malformed, unsigned when a signed one was asked, or does not verify."""

    status = 400
    code = "as2-mdn-invalid"
