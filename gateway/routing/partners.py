"""Partners and their API keys.

An API key looks like ``<key id>.<secret>``: the key id (``acme-demo``) is
not secret, it names the configured key to check against; the secret is 32
random bytes in URL-safe base64. The configuration stores only a salted
scrypt hash of the whole key (:func:`hash_key`)::

    scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

Verifying a key costs one scrypt (deliberately slow, 16 MiB; it runs in a worker thread
so the event loop never waits on it, at most ``max_parallel_verifications``
at a time) and a constant-time comparison. A key that verified is then
remembered by a keyed BLAKE2b digest (a random key per process, so the cache
holds nothing an attacker could test offline), so that every later request
with it costs a digest instead of a scrypt (see ``tests/gateway/test_partners.py``).
A key id that is not configured fails at once, without a hash: key ids are
not secrets (a client learns no more from timing than from the id itself).
Every failure is the same :class:`~gateway.errors.AuthenticationError`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import hmac
import math
import os
import re
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from gateway.config.loader import (
    MarkedDict,
    Settings,
    Where,
    check_keys,
    expect_bool,
    expect_int,
    expect_list,
    expect_mapping,
    expect_str,
)
from gateway.as2.config import parse_partner_as2
from gateway.errors import (
    AuthenticationError,
    ConcurrencyLimitedError,
    ConfigError,
    RateLimitedError,
    TooManyRequestsError,
    clip,
)

__all__ = [
    "ApiKey",
    "DEFAULT_PARTNER_LIMITS",
    "Partner",
    "PartnerLimiter",
    "PartnerLimits",
    "PartnerRegistry",
    "generate_key",
    "hash_key",
    "verify_key",
]

#: scrypt cost: N = 2**LN (16384), r = 8, p = 1: 16 MiB per check, and slow by design.
DEFAULT_LN = 14
DEFAULT_R = 8
DEFAULT_P = 1
_DKLEN = 32
_SALT_BYTES = 16

_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PARTNER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_TOKEN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,63})\.([A-Za-z0-9_-]{16,256})$")
_HASH = re.compile(r"^scrypt\$ln=(\d{1,2}),r=(\d{1,2}),p=(\d{1,2})\$([A-Za-z0-9+/=_-]+)\$([A-Za-z0-9+/=_-]+)$")

_AUTH_DETAIL = "Authenticate with the header 'Authorization: Bearer <API key>' and the API key agreed for your partner account."


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_key(key: str, *, ln: int = DEFAULT_LN, r: int = DEFAULT_R, p: int = DEFAULT_P,
             salt: bytes | None = None) -> str:
    """The salted scrypt hash of API key *key*, in the form the configuration stores."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(key.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26, dklen=_DKLEN)
    return f"scrypt$ln={ln},r={r},p={p}${_b64(salt)}${_b64(digest)}"


def _parse_hash(encoded: str) -> tuple[int, int, int, bytes, bytes] | None:
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


def verify_key(key: str, encoded: str) -> bool:
    """Whether *key* hashes to *encoded* (constant-time comparison)."""
    parsed = _parse_hash(encoded)
    if parsed is None:
        return False
    ln, r, p, salt, digest = parsed
    candidate = hashlib.scrypt(key.encode("utf-8"), salt=salt, n=2**ln, r=r, p=p, maxmem=2**26, dklen=len(digest))
    return hmac.compare_digest(candidate, digest)


def generate_key(key_id: str) -> str:
    """A new random API key for key id *key_id*."""
    if not _KEY_ID.match(key_id):
        raise ValueError(f"key id {key_id!r} must be 1-64 letters, digits, '-' or '_' (starting with a letter or digit)")
    return f"{key_id}.{secrets.token_urlsafe(32)}"


@dataclass(frozen=True, slots=True)
class PartnerLimits:
    """How much one partner may ask of one serving process (``limits:`` of a partner in partners.yaml,
    else of its ``defaults:``, else these values, generous enough never to slow an honest client).

    ``concurrent_requests``: requests in progress at once (from the headers read to the answer);
    ``requests_per_second`` and ``burst``: a token bucket of ``burst`` requests refilled at that rate.
    Over either, the request is answered 429 with ``Retry-After`` before its body is read, and
    ``refusal_delay`` seconds after its headers came: a client that ignores ``Retry-After`` and asks again
    at once gets its refusals no faster than its connections allow (each waits that long), instead of
    taking the event loop's time from the other partners with thousands of refusals a second.
    """

    concurrent_requests: int = 256
    requests_per_second: float = 10_000.0
    burst: int = 10_000
    refusal_delay: float = 0.25


DEFAULT_PARTNER_LIMITS = PartnerLimits()
_LIMIT_KEYS = {"concurrent_requests", "requests_per_second", "burst", "refusal_delay"}
#: The longest ``refusal_delay`` (every request is answered within two seconds, a refusal included).
MAX_REFUSAL_DELAY = 1.0


def _partner_limits(value: Any, where: Where, what: str, base: PartnerLimits) -> PartnerLimits:
    """A ``limits:`` mapping over *base*, each value checked at its line."""
    limits = expect_mapping(value, where, f"{what} limits")
    check_keys(limits, _LIMIT_KEYS, f"{what} limits")
    concurrent, rate, burst = base.concurrent_requests, base.requests_per_second, base.burst
    delay = base.refusal_delay
    if "concurrent_requests" in limits:
        concurrent = expect_int(limits["concurrent_requests"], limits.at("concurrent_requests"),
                                f"{what} limits.concurrent_requests", minimum=1, maximum=100_000)
    if "requests_per_second" in limits:
        rate = limits["requests_per_second"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1_000_000:
            raise limits.at("requests_per_second").error(
                f"{what} limits.requests_per_second must be a number above 0 and at most 1000000; got {clip(repr(rate), 40)}")
        rate = float(rate)
        if "burst" not in limits:
            burst = max(1, math.ceil(rate))  # one second's worth
    if "burst" in limits:
        burst = expect_int(limits["burst"], limits.at("burst"), f"{what} limits.burst", minimum=1, maximum=10_000_000)
    if "refusal_delay" in limits:
        delay = limits["refusal_delay"]
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_REFUSAL_DELAY:
            raise limits.at("refusal_delay").error(
                f"{what} limits.refusal_delay must be a number of seconds from 0 to {MAX_REFUSAL_DELAY:g}; got "
                f"{clip(repr(delay), 40)}")
        delay = float(delay)
    return PartnerLimits(concurrent, rate, burst, delay)


@dataclass(frozen=True, slots=True)
class Partner:
    """A trading partner: ``id`` (what routes, the ledger and ``JMSXUserID`` name), a display ``name``,
    and its request ``limits``."""

    id: str
    name: str
    enabled: bool = True
    limits: PartnerLimits = field(default=DEFAULT_PARTNER_LIMITS, compare=False)
    #: the partner's AS2 agreement (gateway.as2.config.PartnerAgreement), None when it does not use AS2
    as2: Any = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured API key: its public ``id``, its ``partner`` and its hash."""

    id: str
    partner: str
    hash: str


class PartnerRegistry:
    """The configured partners and keys; authenticates ``Authorization`` headers."""

    def __init__(self, partners: dict[str, Partner], keys: dict[str, ApiKey], *,
                 max_parallel_verifications: int = 2, negative_cache_size: int = 4096) -> None:
        self.partners = dict(partners)
        self.keys = dict(keys)
        self._cache_key = os.urandom(32)
        self._verified: dict[bytes, Partner] = {}
        self._refused: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._negative_size = negative_cache_size
        self._lock = threading.Lock()
        self._max_parallel = max(1, max_parallel_verifications)
        self._loop_state: weakref.WeakKeyDictionary[Any, tuple[asyncio.Semaphore, dict[bytes, asyncio.Future[Partner]]]] = (
            weakref.WeakKeyDictionary())
        #: scrypt verifications run so far (for tests and metrics)
        self.verifications = 0

    # ----------------------------------------------------------------- configuration

    @classmethod
    def from_settings(cls, settings: Settings) -> PartnerRegistry:
        """Build the registry from the ``partners:`` section (and the partners file's ``defaults:``);
        ConfigError with file and line."""
        return cls.from_mapping(settings.partners, getattr(settings, "partner_defaults", None))

    @classmethod
    def from_mapping(cls, section: MarkedDict, defaults: MarkedDict | None = None) -> PartnerRegistry:
        base = DEFAULT_PARTNER_LIMITS
        if defaults:
            check_keys(defaults, {"limits"}, "defaults")
            base = _partner_limits(defaults.get("limits"), defaults.at("limits"), "defaults", base)
        partners: dict[str, Partner] = {}
        keys: dict[str, ApiKey] = {}
        for partner_id, body in section.items():
            where = section.at(partner_id)
            if not isinstance(partner_id, str) or not _PARTNER_ID.match(partner_id):
                raise where.error(
                    f"partner id {clip(str(partner_id), 60)!r} must be 1-100 letters, digits, '.', '-' or '_'"
                )
            entry = expect_mapping(body, where, f"partner {partner_id!r}")
            check_keys(entry, {"name", "enabled", "keys", "limits", "as2"}, f"partner {partner_id!r}")
            name = expect_str(entry.get("name", partner_id), entry.at("name"), f"partner {partner_id!r} name")
            enabled = expect_bool(entry.get("enabled", True), entry.at("enabled"), f"partner {partner_id!r} enabled")
            limits = (_partner_limits(entry["limits"], entry.at("limits"), f"partner {partner_id!r}", base)
                      if "limits" in entry else base)
            as2 = parse_partner_as2(partner_id, entry["as2"], entry.at("as2")) if "as2" in entry else None
            partners[partner_id] = Partner(partner_id, name, enabled, limits, as2)
            key_list = expect_list(entry.get("keys"), entry.at("keys"), f"partner {partner_id!r} keys")
            for i, item in enumerate(key_list):
                kw = key_list.at(i)
                key = expect_mapping(item, kw, "an API key entry")
                check_keys(key, {"id", "hash"}, "an API key entry")
                key_id = expect_str(key.get("id"), key.at("id"), "API key id", pattern=_KEY_ID,
                                    hint="1-64 letters, digits, '-' or '_'")
                encoded = expect_str(key.get("hash"), key.at("hash"), f"API key {key_id!r} hash")
                if _parse_hash(encoded) is None:
                    raise key.at("hash").error(
                        f"API key {key_id!r}: hash must be 'scrypt$ln=..,r=..,p=..$<salt>$<hash>' as printed by "
                        "`b2bgw key new`; plain keys are never stored"
                    )
                if key_id in keys:
                    raise key.at("id").error(
                        f"API key id {key_id!r} is already used (by partner {keys[key_id].partner!r}); key ids are unique"
                    )
                keys[key_id] = ApiKey(key_id, partner_id, encoded)
        return cls(partners, keys)

    def get(self, partner_id: str) -> Partner | None:
        return self.partners.get(partner_id)

    def __contains__(self, partner_id: object) -> bool:
        return partner_id in self.partners

    # ----------------------------------------------------------------- authentication

    def _digest(self, token: str) -> bytes:
        return hashlib.blake2b(token.encode("utf-8"), key=self._cache_key, digest_size=32).digest()

    @staticmethod
    def _token(authorization: str | None) -> str:
        if not authorization or len(authorization) > 400:
            raise AuthenticationError(_AUTH_DETAIL)
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthenticationError(_AUTH_DETAIL)
        return token.strip()

    def _cached(self, token: str) -> tuple[bytes, Partner | None]:
        digest = self._digest(token)
        partner = self._verified.get(digest)
        if partner is not None:
            return digest, partner
        if digest in self._refused:
            raise AuthenticationError(_AUTH_DETAIL)
        return digest, None

    def _slow_check(self, token: str, digest: bytes) -> Partner:
        m = _TOKEN.match(token)
        key = self.keys.get(m.group(1)) if m else None
        ok = False
        if key is not None:
            self.verifications += 1
            ok = verify_key(token, key.hash)
        partner = self.partners.get(key.partner) if ok and key is not None else None
        with self._lock:
            if partner is None:
                self._refused[digest] = None
                while len(self._refused) > self._negative_size:
                    self._refused.popitem(last=False)
            else:
                self._verified[digest] = partner
        if partner is None or not partner.enabled:
            raise AuthenticationError(_AUTH_DETAIL)
        return partner

    def authenticate(self, authorization: str | None) -> Partner:
        """The partner an ``Authorization`` header value authenticates; AuthenticationError if none."""
        token = self._token(authorization)
        digest, partner = self._cached(token)
        if partner is not None:
            if not partner.enabled:
                raise AuthenticationError(_AUTH_DETAIL)
            return partner
        return self._slow_check(token, digest)

    async def authenticate_async(self, authorization: str | None) -> Partner:
        """Like :meth:`authenticate`; a key not yet verified is hashed in a worker thread.

        Concurrent requests with the same new key share one verification."""
        token = self._token(authorization)
        digest, partner = self._cached(token)
        if partner is not None:
            if not partner.enabled:
                raise AuthenticationError(_AUTH_DETAIL)
            return partner
        loop = asyncio.get_running_loop()
        state = self._loop_state.get(loop)
        if state is None:
            state = self._loop_state[loop] = (asyncio.Semaphore(self._max_parallel), {})
        semaphore, pending = state
        future = pending.get(digest)
        if future is None:
            future = pending[digest] = loop.create_future()
            try:
                async with semaphore:
                    result = await asyncio.to_thread(self._slow_check, token, digest)
            except BaseException as exc:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters (if any) re-raise it
                raise
            else:
                future.set_result(result)
            finally:
                pending.pop(digest, None)
            return result
        return await asyncio.shield(future)


class PartnerLimiter:
    """Each partner's requests in progress and its token bucket, for one serving process.

    Used from the event loop only (no lock): :meth:`acquire` before a request's body is read, raising
    :class:`~gateway.errors.ConcurrencyLimitedError` or :class:`~gateway.errors.RateLimitedError`
    (nothing counted then), and :meth:`release` once it is answered. A refused request costs a dict
    look-up and a few additions, so a partner's flood is turned away without crowding out the others.
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._in_progress: dict[str, int] = {}
        self._buckets: dict[str, list[float]] = {}  # partner id -> [tokens, when last refilled]

    async def admit(self, partner: Partner) -> None:
        """:meth:`acquire`, the refusal raised ``refusal_delay`` seconds later (see :class:`PartnerLimits`)."""
        try:
            self.acquire(partner)
        except TooManyRequestsError:
            delay = partner.limits.refusal_delay
            if delay > 0:
                await asyncio.sleep(delay)
            raise

    def acquire(self, partner: Partner) -> None:
        limits = partner.limits
        pid = partner.id
        running = self._in_progress.get(pid, 0)
        if running >= limits.concurrent_requests:
            raise ConcurrencyLimitedError(
                f"Your partner account already has {running} requests in progress, the most this gateway takes "
                f"at once (limits.concurrent_requests is {limits.concurrent_requests}); wait for their answers "
                "before sending more.", retry_after=1)
        now = self._clock()
        bucket = self._buckets.get(pid)
        if bucket is None:
            bucket = self._buckets[pid] = [float(limits.burst), now]
        tokens = min(float(limits.burst), bucket[0] + (now - bucket[1]) * limits.requests_per_second)
        bucket[1] = now
        if tokens < 1.0 - 1e-9:  # (a client exactly at the rate: float sums fall short by a hair)
            bucket[0] = tokens
            wait = math.ceil((1.0 - tokens) / limits.requests_per_second)
            raise RateLimitedError(
                f"Your partner account sends more than {limits.requests_per_second:g} requests per second (bursts "
                f"of {limits.burst}), the rate agreed (limits.requests_per_second); retry after {wait} s and "
                "spread your requests out.", retry_after=wait)
        bucket[0] = max(0.0, tokens - 1.0)
        self._in_progress[pid] = running + 1

    def release(self, partner: Partner) -> None:
        pid = partner.id
        running = self._in_progress.get(pid, 0) - 1
        if running > 0:
            self._in_progress[pid] = running
        else:
            self._in_progress.pop(pid, None)

    def in_progress(self, partner_id: str) -> int:
        return self._in_progress.get(partner_id, 0)


def key_entry_yaml(key_id: str, key: str) -> str:
    """The YAML lines to paste under a partner's ``keys:`` for *key*."""
    return f"      - id: {key_id}\n        hash: \"{hash_key(key)}\"\n"

