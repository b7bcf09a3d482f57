"""STOMP passcodes at rest: salted scrypt hashes, compared in constant time.

The form is the one partner API keys use in the gateway's configuration::

    scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

so one tool reads both. A check costs one scrypt (16 MiB, tens of
milliseconds): the listener runs it in a thread, one at a time, and only
after the throttle of failed logins let it through (``_auth``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets

__all__ = ["hash_passcode", "verify_passcode", "is_passcode_hash", "generate_passcode"]

DEFAULT_LN = 14
_HASH = re.compile(r"^scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})\$([A-Za-z0-9+/=_-]+)\$([A-Za-z0-9+/=_-]+)$")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def generate_passcode() -> str:
    """A new random passcode (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def hash_passcode(passcode: str, *, ln: int = DEFAULT_LN, r: int = 8, p: int = 1) -> str:
    """The salted scrypt hash of *passcode*, in the form ``users`` take."""
    salt = os.urandom(16)
    digest = hashlib.scrypt(passcode.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26, dklen=32)
    return f"scrypt$ln={ln},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def _parse(encoded: str) -> tuple[int, int, int, bytes, bytes] | None:
    m = _HASH.match(encoded)
    if not m:
        return None
    ln, r, p = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not (1 <= ln <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        return None
    try:
        salt, digest = _unb64(m.group(4)), _unb64(m.group(5))
    except ValueError:
        return None
    if len(salt) < 8 or len(digest) < 16:
        return None
    return ln, r, p, salt, digest


def is_passcode_hash(encoded: str) -> bool:
    """Whether *encoded* is a hash :func:`verify_passcode` can check."""
    return isinstance(encoded, str) and _parse(encoded) is not None


def verify_passcode(passcode: str, encoded: str) -> bool:
    """Whether *passcode* hashes to *encoded* (constant-time comparison)."""
    parsed = _parse(encoded)
    if parsed is None:
        return False
    ln, r, p, salt, digest = parsed
    candidate = hashlib.scrypt(passcode.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26,
                               dklen=len(digest))
    return hmac.compare_digest(candidate, digest)
