"""Secrets at rest: salted scrypt hashes, compared in constant time.

One form for every secret the project keeps a hash of (STOMP passcodes, partner API keys, operators'
secrets)::

    scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

A check costs one scrypt (16 MiB at the default cost, tens of milliseconds): callers run it off their
event loop and behind their own throttles.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

__all__ = ["DEFAULT_LN", "hash_secret", "is_secret_hash", "verify_secret"]

#: scrypt cost: N = 2**LN (16384), r = 8, p = 1: 16 MiB per check, and slow by design.
DEFAULT_LN = 14
_HASH = re.compile(r"^scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})\$([A-Za-z0-9+/=_-]+)\$([A-Za-z0-9+/=_-]+)$")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_secret(secret: str, *, ln: int = DEFAULT_LN, r: int = 8, p: int = 1, salt: bytes | None = None) -> str:
    """The salted scrypt hash of *secret*, in the form above."""
    salt = os.urandom(16) if salt is None else salt
    digest = hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26, dklen=32)
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


def is_secret_hash(encoded: object) -> bool:
    """Whether *encoded* is a hash :func:`verify_secret` can check."""
    return isinstance(encoded, str) and _parse(encoded) is not None


def verify_secret(secret: str, encoded: str) -> bool:
    """Whether *secret* hashes to *encoded* (constant-time comparison); False for a malformed hash."""
    parsed = _parse(encoded)
    if parsed is None:
        return False
    ln, r, p, salt, digest = parsed
    candidate = hashlib.scrypt(secret.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26, dklen=len(digest))
    return hmac.compare_digest(candidate, digest)
