"""Partner keys under attack: HMAC digests, scrypt hashes migrated on first use, a flood of random tokens
with a public key id, failed authentications throttled per address, the bounded queue of first checks.
Against a real store (SQLite) and, for the HTTP answers, a real server."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa
from gwtest import GLOBEX, GLOBEX_KEY, INVOICE, with_id
from sectest import RealServer

from broker_core import Broker
from gateway.config.loader import load_yaml
from gateway.errors import AuthenticationBusyError, AuthenticationError, AuthenticationThrottledError
from gateway.http.app import create_app
from gateway.ledger.records import upgrade_ledger
from gateway.routing.partners import PartnerRegistry, generate_key, hash_key
from gateway.runtime.serving import Runtime
from gateway.security.keys import KeyDigests, hmac_hash
from gateway.security.tables import key_digests


@pytest.fixture()
def broker(tmp_path) -> Iterator[Broker]:
    b = Broker.open(f"sqlite:///{tmp_path / 'keys.db'}")
    upgrade_ledger(b.engine)
    yield b
    b.close()


def _registry(key_id: str, encoded: str) -> PartnerRegistry:
    return PartnerRegistry.from_mapping(load_yaml(text=f'p1:\n  keys:\n    - id: {key_id}\n      hash: "{encoded}"\n'))


def _random_token(key_id: str) -> str:
    return f"Bearer {key_id}.{secrets.token_urlsafe(32)}"


def test_an_hmac_key_verifies_under_the_stores_secret_only(broker, tmp_path):
    digests = KeyDigests.for_broker(broker)
    key = generate_key("h1")
    registry = _registry("h1", hmac_hash(digests.secret, key))
    with pytest.raises(AuthenticationBusyError):  # before the store's secret is known: retry later
        registry.authenticate(f"Bearer {key}")
    registry = _registry("h1", hmac_hash(digests.secret, key))
    registry.attach(digests)
    assert registry.authenticate(f"Bearer {key}").id == "p1"
    with pytest.raises(AuthenticationError):
        registry.authenticate(f"Bearer {key}x")
    assert registry.verifications == 0  # no scrypt at all
    other = Broker.open(f"sqlite:///{tmp_path / 'other.db'}")  # another store: another secret
    try:
        upgrade_ledger(other.engine)
        elsewhere = _registry("h1", hmac_hash(digests.secret, key))
        elsewhere.attach(KeyDigests.for_broker(other))
        with pytest.raises(AuthenticationError):
            elsewhere.authenticate(f"Bearer {key}")
    finally:
        other.close()


def test_every_process_of_a_store_shares_one_secret(broker):
    assert KeyDigests.for_broker(broker).secret == KeyDigests.for_broker(broker).secret
    assert len(KeyDigests.for_broker(broker).secret) == 32


def test_a_scrypt_key_is_migrated_on_first_use(broker):
    key = generate_key("old-1")
    encoded = hash_key(key, ln=10)
    first = _registry("old-1", encoded)
    first.attach(KeyDigests.for_broker(broker))
    assert first.authenticate(f"Bearer {key}").id == "p1"
    assert first.verifications == 1
    with broker.engine.connect() as conn:
        [row] = conn.execute(sa.select(key_digests)).all()
    assert row.key_id == "old-1" and row.source == encoded and row.digest.startswith("hmac-sha256$")
    assert key not in row.digest and key.split(".")[1] not in row.digest

    # another process (or this one restarted): the key verifies without scrypt, and so do refusals
    second = _registry("old-1", encoded)
    second.attach(KeyDigests.for_broker(broker))
    assert second.authenticate(f"Bearer {key}").id == "p1"
    for _ in range(5):
        with pytest.raises(AuthenticationError):
            second.authenticate(_random_token("old-1"))
    assert second.verifications == 0

    # a new scrypt hash configured for that key id voids the migrated digest: the old key no longer works
    replaced = _registry("old-1", hash_key(generate_key("old-1"), ln=10))
    replaced.attach(KeyDigests.for_broker(broker))
    with pytest.raises(AuthenticationError):
        replaced.authenticate(f"Bearer {key}")
    assert replaced.verifications == 1


def test_a_migration_by_another_process_is_picked_up_without_scrypt(broker):
    key = generate_key("old-2")
    encoded = hash_key(key, ln=10)
    waiting = _registry("old-2", encoded)
    waiting.attach(KeyDigests.for_broker(broker))  # started before the key was ever used
    migrating = _registry("old-2", encoded)
    migrating.attach(KeyDigests.for_broker(broker))
    assert migrating.authenticate(f"Bearer {key}").id == "p1"
    assert asyncio.run(waiting.authenticate_async(f"Bearer {key}")).id == "p1"
    assert waiting.verifications == 0


def test_a_flood_of_random_tokens_with_a_known_key_id_costs_microseconds_each(broker):
    key = generate_key("flooded")
    registry = _registry("flooded", hash_key(key))  # the full scrypt cost: 16 MiB, tens of milliseconds
    registry.attach(KeyDigests.for_broker(broker))
    assert registry.authenticate(f"Bearer {key}").id == "p1"  # migrated on first use
    tokens = [_random_token("flooded") for _ in range(2000)]

    async def flood() -> int:
        refused = 0
        for token in tokens:
            try:
                await registry.authenticate_async(token)
            except AuthenticationError:
                refused += 1
        return refused

    started = time.process_time()
    assert asyncio.run(flood()) == len(tokens)
    per_refusal = (time.process_time() - started) / len(tokens)
    assert registry.verifications == 1  # the first use only: no refusal ran scrypt
    # the processor time of a refusal: an HMAC and a few look-ups (~10-50 us); one scrypt here is ~50 ms
    assert per_refusal < 0.002, f"{per_refusal * 1e3:.3f} ms of processor time per refused token"


def test_failures_from_one_address_are_throttled_before_any_hashing():
    key = generate_key("t1")
    registry = _registry("t1", hash_key(key, ln=10))

    async def main() -> None:
        for _ in range(registry.throttle.max_failures):
            with pytest.raises(AuthenticationError):
                await registry.authenticate_async(_random_token("t1"), "192.0.2.7")
        spent = registry.verifications
        with pytest.raises(AuthenticationThrottledError) as info:
            await registry.authenticate_async(_random_token("t1"), "192.0.2.7")
        assert info.value.status == 429 and 1 <= info.value.retry_after <= 60
        assert registry.verifications == spent  # refused before any scrypt
        # another address, and a key that verified from the throttled one, still go through
        assert (await registry.authenticate_async(f"Bearer {key}", "192.0.2.8")).id == "p1"
        assert (await registry.authenticate_async(f"Bearer {key}", "192.0.2.7")).id == "p1"

    asyncio.run(main())


def test_the_queue_of_first_checks_is_bounded():
    key = generate_key("q1")
    registry = PartnerRegistry.from_mapping(
        load_yaml(text=f'p1:\n  keys:\n    - id: q1\n      hash: "{hash_key(key, ln=12)}"\n')
    )
    registry._max_pending = 4

    async def one(token: str) -> object:
        try:
            return await registry.authenticate_async(token)
        except (AuthenticationError, AuthenticationBusyError) as exc:
            return exc

    async def main() -> list[object]:
        return await asyncio.gather(*[one(_random_token("q1")) for _ in range(40)])

    answers = asyncio.run(main())
    busy = [a for a in answers if isinstance(a, AuthenticationBusyError)]
    assert len(busy) >= 40 - 4 and all(a.status == 503 and a.retry_after >= 1 for a in busy)
    assert registry.verifications <= 4
    assert all(isinstance(a, AuthenticationError) for a in answers if a not in busy)


# --------------------------------------------------------------------------- over HTTP, a real server


@pytest.fixture()
def real(make_assembly) -> Iterator[RealServer]:
    assembly = make_assembly()
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        with RealServer(create_app(assembly, runtime=runtime)) as server:
            yield server
    finally:
        runtime.stop()


def test_http_bad_keys_from_one_address_get_429_and_honest_partners_carry_on(real):
    url = real.base + "/v1/documents"  # a connection each: an early refusal ends its connection
    assert httpx.post(url, content=with_id(INVOICE, "THR-0"), headers=GLOBEX, timeout=60).status_code == 202
    statuses = []
    for _ in range(30):
        r = httpx.post(
            url, content=INVOICE, headers={**GLOBEX, "Authorization": _random_token("globex-demo")}, timeout=60
        )
        statuses.append(r.status_code)
    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    assert r.json()["code"] == "authentication-throttled" and int(r.headers["retry-after"]) >= 1
    # the honest partner behind the same address: its key verified before, it is never throttled
    assert httpx.post(url, content=with_id(INVOICE, "THR-1"), headers=GLOBEX, timeout=60).status_code == 202


def test_http_a_flood_of_first_checks_gets_503_with_retry_after(real):
    async def one(i: int) -> httpx.Response:
        transport = httpx.AsyncHTTPTransport(local_address=f"127.0.{i // 200}.{2 + i % 200}")  # one address each
        async with httpx.AsyncClient(transport=transport, base_url=real.base, timeout=120) as client:
            return await client.post(
                "/v1/documents", content=INVOICE, headers={**GLOBEX, "Authorization": _random_token("globex-demo")}
            )

    async def main() -> list[httpx.Response]:
        return await asyncio.gather(*[one(i) for i in range(80)])

    answers = asyncio.run(main())
    codes = [r.status_code for r in answers]
    assert set(codes) <= {401, 503} and codes.count(503) >= 80 - 32 - 2, codes
    busy = next(r for r in answers if r.status_code == 503)
    assert busy.json()["code"] == "authentication-busy" and int(busy.headers["retry-after"]) >= 1
    with httpx.Client(base_url=real.base, timeout=60) as client:  # the real key still gets in afterwards
        r = client.post(
            "/v1/documents",
            content=with_id(INVOICE, "AFTER-FLOOD"),
            headers={**GLOBEX, "Authorization": f"Bearer {GLOBEX_KEY}"},
        )
        assert r.status_code == 202
