"""Partners and their API keys.

An API key looks like ``<key id>.<secret>``: the key id (``acme-demo``) is
not secret, it names the configured key to check against; the secret is 32
random bytes in URL-safe base64. The configuration stores only a digest of the
whole key: ``hmac-sha256$...``, keyed with the server secret
(:mod:`gateway.security.keys`; ``b2bgw key new`` prints it), checked in
microseconds. Keys configured before keep their salted scrypt hash
(:func:`hash_key`)::

    scrypt$ln=14,r=8,p=1$<salt, base64>$<hash, base64>

and are migrated on first use: once one verifies, its HMAC digest is stored and
later checks, in every process, skip scrypt. Until then verifying one costs one
scrypt (16 MiB; in a worker thread, at most ``max_parallel_verifications`` at a
time, at most ``max_pending_verifications`` waiting: beyond, ``503
authentication-busy`` with ``Retry-After``). Failed authentications are counted
per client address and refused before any hashing once too many
(:mod:`gateway.security.throttle`, ``429 authentication-throttled``). A key that verified is then
remembered by a keyed BLAKE2b digest (a random key per process, so the cache
holds nothing an attacker could test offline), so that every later request
with it costs a digest instead of a scrypt (see ``tests/gateway/routing/test_partners.py``).
A key id that is not configured fails at once, without a hash: key ids are
not secrets (a client learns no more from timing than from the id itself).
Every failure is the same :class:`~gateway.errors.AuthenticationError`.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import math
import os
import re
import secrets
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from broker_core.hashes import DEFAULT_LN as SCRYPT_LN
from broker_core.hashes import hash_secret, is_secret_hash, verify_secret
from gateway.as2.config import parse_partner_as2
from gateway.as2.mdn_delivery import with_mdn_endpoint
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
from gateway.delivery.addresses import AddressPolicy
from gateway.delivery.config import NO_DELIVERY, PartnerDelivery, parse_partner_delivery
from gateway.errors import (
    AuthenticationBusyError,
    AuthenticationError,
    ConcurrencyLimitedError,
    RateLimitedError,
    TooManyRequestsError,
    clip,
)
from gateway.security.keys import KeyDigests, is_hmac_hash
from gateway.security.throttle import FailureThrottle
from gateway.trust.pins import KEY_WINDOW_KEYS, PARTNER_TRUST_KEYS, parse_partner_trust, trust_registry

__all__ = [
    "ApiKey",
    "DEFAULT_PARTNER_LIMITS",
    "KEY_ID",
    "PARTNER_ID",
    "Partner",
    "PartnerLimiter",
    "PartnerLimits",
    "PartnerRegistry",
    "generate_key",
    "hash_key",
    "verify_key",
]

#: scrypt cost: N = 2**LN (16384), r = 8, p = 1: 16 MiB per check, and slow by design.
DEFAULT_LN = SCRYPT_LN
DEFAULT_R = 8
DEFAULT_P = 1

_KEY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_PARTNER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
#: What a key id and a partner id may be (the admin side checks the ids it is given against them too).
KEY_ID = _KEY_ID
PARTNER_ID = _PARTNER_ID
_TOKEN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_-]{0,63})\.([A-Za-z0-9_-]{16,256})$")

_AUTH_DETAIL = (
    "Authenticate with the header 'Authorization: Bearer <API key>' and the API key agreed for your partner account."
)


def hash_key(
    key: str, *, ln: int = DEFAULT_LN, r: int = DEFAULT_R, p: int = DEFAULT_P, salt: bytes | None = None
) -> str:
    """The salted scrypt hash of API key *key*, in the form the configuration stores."""
    return hash_secret(key, ln=ln, r=r, p=p, salt=salt)


def verify_key(key: str, encoded: str) -> bool:
    """Whether *key* hashes to *encoded* (constant-time comparison)."""
    return verify_secret(key, encoded)


def generate_key(key_id: str) -> str:
    """A new random API key for key id *key_id*."""
    if not _KEY_ID.match(key_id):
        raise ValueError(
            f"key id {key_id!r} must be 1-64 letters, digits, '-' or '_' (starting with a letter or digit)"
        )
    return f"{key_id}.{secrets.token_urlsafe(32)}"


@dataclass(frozen=True, slots=True)
class PartnerLimits:
    """How much one partner may ask of one serving process (``limits:`` of a partner in partners.yaml,
    else of its ``defaults:``, else these values: enough for an honest client's steady traffic, while one
    partner's requests in progress hold at most 32 bodies, 320 MiB at the default ``limits.max_bytes``,
    instead of the gigabytes 256 did; a high-volume partner is given more in its own ``limits:``).

    ``concurrent_requests``: requests in progress at once (from the headers read to the answer);
    ``requests_per_second`` and ``burst``: a token bucket of ``burst`` requests refilled at that rate.
    Over either, the request is answered 429 with ``Retry-After`` before its body is read, and
    ``refusal_delay`` seconds after its headers came: a client that ignores ``Retry-After`` and asks again
    at once gets its refusals no faster than its connections allow (each waits that long), instead of
    taking the event loop's time from the other partners with thousands of refusals a second.
    """

    concurrent_requests: int = 32
    requests_per_second: float = 500.0
    burst: int = 1_000
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
        concurrent = expect_int(
            limits["concurrent_requests"],
            limits.at("concurrent_requests"),
            f"{what} limits.concurrent_requests",
            minimum=1,
            maximum=100_000,
        )
    if "requests_per_second" in limits:
        rate = limits["requests_per_second"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1_000_000:
            raise limits.at("requests_per_second").error(
                f"{what} limits.requests_per_second must be a number above 0 and at most 1000000; got {clip(repr(rate), 40)}"
            )
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
                f"{clip(repr(delay), 40)}"
            )
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
    #: its delivery endpoints and notifications (:mod:`gateway.delivery.config`)
    delivery: PartnerDelivery = field(default=NO_DELIVERY, compare=False)
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

    def __init__(
        self,
        partners: dict[str, Partner],
        keys: dict[str, ApiKey],
        *,
        max_parallel_verifications: int = 2,
        negative_cache_size: int = 4096,
        max_pending_verifications: int = 32,
    ) -> None:
        self.partners = dict(partners)
        self.keys = dict(keys)
        self._cache_key = os.urandom(32)
        self._verified: dict[bytes, Partner] = {}
        self._refused: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._negative_size = negative_cache_size
        self._lock = threading.Lock()
        self._max_parallel = max(1, max_parallel_verifications)
        self._loop_state: weakref.WeakKeyDictionary[
            Any, tuple[asyncio.Semaphore, dict[bytes, asyncio.Future[Partner]]]
        ] = weakref.WeakKeyDictionary()
        #: each partner's authentication policy, pinned certificates and key windows (gateway.trust.pins)
        self.trust: Any = None
        self._max_pending = max(1, max_pending_verifications)
        #: scrypt verifications run so far (for tests and metrics)
        self.verifications = 0
        #: the server secret and migrated digests (:meth:`attach`); None: hmac keys cannot verify yet
        self.digests: KeyDigests | None = None
        self.throttle = FailureThrottle()
        #: key ids revoked from the admin side (gateway.routing.overlay), kept out of ``keys``
        self.revoked: frozenset[str] = frozenset()
        #: the store's partner changes this registry serves (gateway.routing.overlay.PartnerOverlay), or None
        self.overlay: Any = None

    def attach(self, digests: KeyDigests) -> None:
        """Check keys with *digests* (the store's server secret and migrated scrypt keys) from now on."""
        self.digests = digests

    #: What :meth:`adopt` keeps of the live registry: its lock, the store's digests and server secret (attached
    #: once at start), the per-address throttle, the waiting checks per event loop, the count of scrypt checks
    #: and the store's partner changes. The verified and refused caches are the fresh registry's (empty): a
    #: revoked key must not stay verified.
    KEPT = ("_lock", "digests", "throttle", "_loop_state", "verifications", "overlay")

    def adopt(self, fresh: PartnerRegistry) -> None:
        """Serve *fresh*'s partners, keys and trust from now on (on the event loop: between two requests'
        checks, so that each is checked against the old content or the new, never a mixture)."""
        for name, value in vars(fresh).items():
            if name not in self.KEPT:
                setattr(self, name, value)

    # ----------------------------------------------------------------- configuration

    @classmethod
    def from_settings(cls, settings: Settings) -> PartnerRegistry:
        """Build the registry from the ``partners:`` section (and the partners file's ``defaults:``);
        ConfigError with file and line."""
        return cls.from_mapping(
            settings.partners,
            getattr(settings, "partner_defaults", None),
            getattr(settings, "delivery_addresses", None),
        )

    @classmethod
    def from_mapping(
        cls, section: MarkedDict, defaults: MarkedDict | None = None, addresses: AddressPolicy | None = None
    ) -> PartnerRegistry:
        base = DEFAULT_PARTNER_LIMITS
        if defaults:
            check_keys(defaults, {"limits"}, "defaults")
            base = _partner_limits(defaults.get("limits"), defaults.at("limits"), "defaults", base)
        partners: dict[str, Partner] = {}
        keys: dict[str, ApiKey] = {}
        trust: dict[str, Any] = {}
        for partner_id, body in section.items():
            where = section.at(partner_id)
            if not isinstance(partner_id, str) or not _PARTNER_ID.match(partner_id):
                raise where.error(
                    f"partner id {clip(str(partner_id), 60)!r} must be 1-100 letters, digits, '.', '-' or '_'"
                )
            entry = expect_mapping(body, where, f"partner {partner_id!r}")
            check_keys(
                entry,
                {"name", "enabled", "keys", "limits", "endpoints", "notify", "as2"} | PARTNER_TRUST_KEYS,
                f"partner {partner_id!r}",
            )
            name = expect_str(entry.get("name", partner_id), entry.at("name"), f"partner {partner_id!r} name")
            enabled = expect_bool(entry.get("enabled", True), entry.at("enabled"), f"partner {partner_id!r} enabled")
            limits = (
                _partner_limits(entry["limits"], entry.at("limits"), f"partner {partner_id!r}", base)
                if "limits" in entry
                else base
            )
            as2 = parse_partner_as2(partner_id, entry["as2"], entry.at("as2")) if "as2" in entry else None
            if as2 is not None and addresses is not None:  # asynchronous MDNs obey the gateway's lists too
                as2 = dataclasses.replace(as2, async_mdn_addresses=as2.async_mdn_addresses.within(addresses))
            delivery = with_mdn_endpoint(partner_id, parse_partner_delivery(entry, partner_id, addresses), as2, entry)
            partners[partner_id] = Partner(partner_id, name, enabled, limits, delivery, as2)
            key_list = expect_list(entry.get("keys"), entry.at("keys"), f"partner {partner_id!r} keys")
            for i, item in enumerate(key_list):
                kw = key_list.at(i)
                key = expect_mapping(item, kw, "an API key entry")
                check_keys(key, {"id", "hash"} | KEY_WINDOW_KEYS, "an API key entry")
                key_id = expect_str(
                    key.get("id"), key.at("id"), "API key id", pattern=_KEY_ID, hint="1-64 letters, digits, '-' or '_'"
                )
                encoded = expect_str(key.get("hash"), key.at("hash"), f"API key {key_id!r} hash")
                if not is_secret_hash(encoded) and not is_hmac_hash(encoded):
                    raise key.at("hash").error(
                        f"API key {key_id!r}: hash must be 'hmac-sha256$<digest>' as printed by `b2bgw key new` "
                        "(or an older 'scrypt$ln=..,r=..,p=..$<salt>$<hash>'); plain keys are never stored"
                    )
                if key_id in keys:
                    raise key.at("id").error(
                        f"API key id {key_id!r} is already used (by partner {keys[key_id].partner!r}); key ids are unique"
                    )
                keys[key_id] = ApiKey(key_id, partner_id, encoded)
            trust[partner_id] = parse_partner_trust(entry, partner_id)  # auth, certificates, key windows
        registry = cls(partners, keys)
        registry.trust = trust_registry(trust, section.where)
        return registry

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

    def _cached(self, token: str) -> tuple[bytes, Partner | None, bool]:
        """The token's digest, the partner it verified for lately, whether it was refused lately."""
        digest = self._digest(token)
        partner = self._verified.get(digest)
        if partner is not None:
            return digest, partner, False
        return digest, None, digest in self._refused

    def _remember(self, digest: bytes, partner: Partner | None) -> None:
        with self._lock:
            if partner is None:
                self._refused[digest] = None
                while len(self._refused) > self._negative_size:
                    self._refused.popitem(last=False)
            else:
                self._verified[digest] = partner

    def _settle(self, digest: bytes, partner: Partner | None) -> Partner:
        self._remember(digest, partner)
        if partner is None or not partner.enabled:
            raise AuthenticationError(_AUTH_DETAIL)
        return partner

    def _quick_check(self, token: str, digest: bytes) -> tuple[Partner | None, ApiKey | None]:
        """The partner, checked without scrypt; (None, key) when *key* is a scrypt key not yet migrated.
        AuthenticationError for a token that cannot be right."""
        m = _TOKEN.match(token)
        key = self.keys.get(m.group(1)) if m else None
        if key is None:
            return self._settle(digest, None), None
        digests = self.digests
        if is_hmac_hash(key.hash):
            if digests is None:
                raise AuthenticationBusyError("The gateway is starting; retry in a moment.", retry_after=1)
            return self._settle(
                digest, self.partners.get(key.partner) if digests.check(token, key.hash) else None
            ), None
        migrated = digests.migrated(key.id, key.hash) if digests is not None else None
        if migrated is not None:
            ok = digests.check(token, migrated)  # type: ignore[union-attr]
            return self._settle(digest, self.partners.get(key.partner) if ok else None), None
        return None, key

    def _slow_check(self, token: str, digest: bytes, key: ApiKey) -> Partner:
        """One scrypt (in a worker thread); a key that verifies is migrated to its HMAC digest."""
        self.verifications += 1
        ok = verify_key(token, key.hash)
        partner = self.partners.get(key.partner) if ok else None
        if partner is not None and self.digests is not None:
            try:
                self.digests.record(key.id, key.hash, token)
            except Exception:  # the key still verified; the next use migrates it
                pass
        return self._settle(digest, partner)

    def authenticate(self, authorization: str | None) -> Partner:
        """The partner an ``Authorization`` header value authenticates; AuthenticationError if none."""
        token = self._token(authorization)
        digest, partner, refused = self._cached(token)
        if partner is not None:
            if not partner.enabled:
                raise AuthenticationError(_AUTH_DETAIL)
            return partner
        if refused:
            raise AuthenticationError(_AUTH_DETAIL)
        partner, key = self._quick_check(token, digest)
        if partner is not None:
            return partner
        assert key is not None
        return self._slow_check(token, digest, key)

    async def authenticate_async(self, authorization: str | None, client: str | None = None) -> Partner:
        """Like :meth:`authenticate`; a scrypt key not yet migrated is hashed in a worker thread.

        *client* (the client's address) is refused at once after too many failures
        (:class:`~gateway.security.throttle.FailureThrottle`). Concurrent requests with the same new key share
        one verification; beyond ``max_pending_verifications`` waiting, :class:`AuthenticationBusyError`."""
        token = self._token(authorization)
        digest, partner, refused = self._cached(token)
        if partner is not None:
            if not partner.enabled:
                raise AuthenticationError(_AUTH_DETAIL)
            return partner
        self.throttle.check(client)
        try:
            if refused:
                raise AuthenticationError(_AUTH_DETAIL)
            partner, key = self._quick_check(token, digest)
            if partner is not None:
                return partner
            assert key is not None
            digests = self.digests
            if digests is not None and digests.should_reload(key.id):  # another process may have migrated it
                await asyncio.to_thread(digests.reload, key.id)
                partner, key = self._quick_check(token, digest)
                if partner is not None:
                    return partner
                assert key is not None
            return await self._verify_queued(token, digest, key)
        except AuthenticationError:
            self.throttle.fail(client)
            raise

    async def _verify_queued(self, token: str, digest: bytes, key: ApiKey) -> Partner:
        loop = asyncio.get_running_loop()
        state = self._loop_state.get(loop)
        if state is None:
            state = self._loop_state[loop] = (asyncio.Semaphore(self._max_parallel), {})
        semaphore, pending = state
        future = pending.get(digest)
        if future is not None:
            return await asyncio.shield(future)
        if len(pending) >= self._max_pending:
            raise AuthenticationBusyError(
                f"{len(pending)} API keys are waiting for their first check, the most this gateway queues; "
                "nothing was accepted, retry in a moment.",
                retry_after=1,
            )
        future = pending[digest] = loop.create_future()
        try:
            async with semaphore:
                result = await asyncio.to_thread(self._slow_check, token, digest, key)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters (if any) re-raise it
            raise
        else:
            future.set_result(result)
        finally:
            pending.pop(digest, None)
        return result


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
                "before sending more.",
                retry_after=1,
            )
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
                "spread your requests out.",
                retry_after=wait,
            )
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
