"""Partner keys checked with a keyed hash: HMAC-SHA256 under the server secret.

A partner key is 256 random bits, so no guessing can find it and a slow hash adds nothing but the cost of
every refusal: with scrypt, each random token sent with a public key id cost 16 MiB and tens of
milliseconds of a core. A key's configured hash is now::

    hmac-sha256$<HMAC-SHA256(server secret, "b2bgw partner key" NUL key), URL-safe base64>

(``b2bgw key new`` prints it), and checking a token costs an HMAC, microseconds, on the event loop.

Keys still configured with a scrypt hash keep working: the first time one verifies, its HMAC digest is
stored (``b2b_key_digests``, with the scrypt hash it came from) and every later check, in every process,
compares digests instead of running scrypt. Until then, scrypt checks wait in a bounded queue
(:class:`gateway.routing.partners.PartnerRegistry`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from gateway.security.secret import read_or_create_secret
from gateway.security.tables import key_digests

__all__ = ["HMAC_PREFIX", "KeyDigests", "hmac_digest", "hmac_hash", "is_hmac_hash", "verify_hmac"]

HMAC_PREFIX = "hmac-sha256$"
_HMAC = re.compile(r"^hmac-sha256\$([A-Za-z0-9_-]{43})$")
_CONTEXT = b"b2bgw partner key\0"
#: The shortest pause between two reads of the store for a key not yet migrated (another process may have).
RELOAD_EVERY = 2.0


def hmac_digest(secret: bytes, key: str) -> bytes:
    return hmac.new(secret, _CONTEXT + key.encode("utf-8"), hashlib.sha256).digest()


def hmac_hash(secret: bytes, key: str) -> str:
    """The configured form of *key*'s digest under *secret*."""
    return HMAC_PREFIX + base64.urlsafe_b64encode(hmac_digest(secret, key)).decode("ascii").rstrip("=")


def is_hmac_hash(encoded: str) -> bool:
    return _HMAC.match(encoded) is not None


def verify_hmac(secret: bytes, key: str, encoded: str) -> bool:
    """Whether *key*'s digest under *secret* is *encoded* (constant-time comparison)."""
    return is_hmac_hash(encoded) and hmac.compare_digest(hmac_hash(secret, key), encoded)


class KeyDigests:
    """The server secret and the digests of scrypt-hashed keys that verified, for one serving process.

    Made from a broker (its store's database); reads and writes go through ``broker.write`` so that they take
    the store's turn like every other write.
    """

    def __init__(self, write: Callable[..., list[Any]]) -> None:
        self._write = write
        self.secret: bytes = write(read_or_create_secret)[0]
        self._digests: dict[str, tuple[str, str]] = {}  # key id -> (scrypt hash, configured-form digest)
        self._read_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self.reload()

    @classmethod
    def for_broker(cls, broker: Any) -> KeyDigests:
        return cls(broker.write)

    def reload(self, key_id: str | None = None) -> None:
        """Read the stored digests (of *key_id* only, when given)."""

        def read(conn: sa.Connection) -> list[Any]:
            query = sa.select(key_digests)
            if key_id is not None:
                query = query.where(key_digests.c.key_id == key_id)
            return list(conn.execute(query).all())

        rows = self._write(read, durable=False)[0]
        with self._lock:
            for row in rows:
                self._digests[row.key_id] = (row.source, row.digest)
            if key_id is not None:
                self._read_at[key_id] = time.monotonic()

    def should_reload(self, key_id: str) -> bool:
        """Whether the store may hold a digest for *key_id* that this process has not read lately."""
        return time.monotonic() - self._read_at.get(key_id, 0.0) >= RELOAD_EVERY

    def migrated(self, key_id: str, source: str) -> str | None:
        """The digest stored for *key_id* when it was verified against *source* (its configured scrypt hash)."""
        found = self._digests.get(key_id)
        return found[1] if found is not None and hmac.compare_digest(found[0], source) else None

    def check(self, token: str, encoded: str) -> bool:
        return verify_hmac(self.secret, token, encoded)

    def record(self, key_id: str, source: str, token: str) -> None:
        """Store the digest of *token*, just verified against the scrypt hash *source* of *key_id*."""
        digest = hmac_hash(self.secret, token)
        row = {"key_id": key_id, "source": source, "digest": digest, "migrated_at": int(time.time() * 1000)}

        def upsert(conn: sa.Connection) -> None:
            conn.execute(key_digests.delete().where(key_digests.c.key_id == key_id))
            conn.execute(key_digests.insert(), row)

        self._write(upsert)
        with self._lock:
            self._digests[key_id] = (source, digest)
