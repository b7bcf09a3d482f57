"""STOMP passcodes at rest: salted scrypt hashes, compared in constant time.

The form is the one partner API keys use in the gateway's configuration::

    scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

so one tool reads both. A check costs one scrypt (16 MiB, tens of
milliseconds): the listener runs it in a thread, one at a time, and only
after the throttle of failed logins let it through (``_auth``).
"""

from __future__ import annotations

import secrets

from broker_core.hashes import DEFAULT_LN, hash_secret, is_secret_hash, verify_secret

__all__ = ["hash_passcode", "verify_passcode", "is_passcode_hash", "generate_passcode"]


def generate_passcode() -> str:
    """A new random passcode (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def hash_passcode(passcode: str, *, ln: int = DEFAULT_LN, r: int = 8, p: int = 1) -> str:
    """The salted scrypt hash of *passcode*, in the form ``users`` take."""
    return hash_secret(passcode, ln=ln, r=r, p=p)


def is_passcode_hash(encoded: str) -> bool:
    """Whether *encoded* is a hash :func:`verify_passcode` can check."""
    return is_secret_hash(encoded)


def verify_passcode(passcode: str, encoded: str) -> bool:
    """Whether *passcode* hashes to *encoded* (constant-time comparison)."""
    return verify_secret(passcode, encoded)
