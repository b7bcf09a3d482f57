"""Standard Webhooks signatures: ``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``.

The signature is HMAC-SHA256, keyed by the base64-decoded secret (``whsec_<base64>``), over
``<id>.<timestamp>.<body>``, sent base64-encoded as ``v1,<signature>``; several secrets (during a
rotation) give several space-separated signatures, any of which the receiver may check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time

from gateway.marked import Where

__all__ = ["PREFIX", "parse_secret", "signature_headers", "sign"]

PREFIX = "whsec_"


def parse_secret(text: str, where: Where, what: str) -> bytes:
    """The key of a ``whsec_<base64>`` secret (ConfigError when it is not one, or shorter than 24 bytes)."""
    raw = text[len(PREFIX) :] if text.startswith(PREFIX) else None
    try:
        key = base64.b64decode(raw, validate=True) if raw else b""
    except (binascii.Error, ValueError):
        key = b""
    if len(key) < 24:
        raise where.error(
            f"{what} must be 'whsec_' followed by base64 of at least 24 random bytes (make one "
            "with: python -c \"import base64,os; print('whsec_'+base64.b64encode(os.urandom(32))"
            '.decode())")'
        )
    return key


def sign(keys: tuple[bytes, ...], webhook_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: one ``v1,<base64>`` per key, space-separated."""
    signed = f"{webhook_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode("ascii") for key in keys
    )


def signature_headers(
    keys: tuple[bytes, ...], webhook_id: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt (the timestamp is the attempt's, in seconds)."""
    timestamp = int(time.time() if now is None else now)
    headers = {"webhook-id": webhook_id, "webhook-timestamp": str(timestamp)}
    if keys:
        headers["webhook-signature"] = sign(keys, webhook_id, timestamp, body)
    return headers
