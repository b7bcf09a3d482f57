"""Per-partner request limits (gateway.routing.partners.PartnerLimits / PartnerLimiter): requests in progress and
a token-bucket rate, configured in partners.yaml (a partner's ``limits:`` over the file's ``defaults:``),
answered 429 with ``Retry-After`` (RFC 9110 section 10.2.3) before the body is read, and one partner's
flood never refuses another's requests.
"""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from gwtest import ACME, GLOBEX, INVOICE, ORDER, REPO, SAMPLE_CONFIG, sample_data, with_id
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config.loader import load_yaml, settings_from_mapping
from gateway.errors import ConcurrencyLimitedError, ConfigError, RateLimitedError
from gateway.routing.partners import DEFAULT_PARTNER_LIMITS, Partner, PartnerLimiter, PartnerLimits, PartnerRegistry

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --------------------------------------------------------------------------- the limiter


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 3.0, 10.0, 250.0]),
    burst=st.integers(1, 20),
    gaps=st.lists(st.floats(0, 2.0, allow_nan=False), min_size=1, max_size=120),
)
def test_no_window_accepts_more_than_the_burst_plus_the_rate(rate: float, burst: int, gaps: list[float]) -> None:
    clock = Clock()
    limiter = PartnerLimiter(clock)
    partner = Partner("p", "P", limits=PartnerLimits(1000, rate, burst))
    accepted: list[float] = []
    for gap in gaps:
        clock.now += gap
        try:
            limiter.acquire(partner)
        except RateLimitedError as exc:
            assert exc.retry_after >= 1 and exc.status == 429 and exc.code == "rate-limited"
        else:
            limiter.release(partner)
            accepted.append(clock.now)
    for i, start in enumerate(accepted):  # every window [start, end] of accepted requests
        for j in range(i, len(accepted)):
            assert j - i + 1 <= burst + rate * (accepted[j] - start) + 1e-9


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([1.0, 2.0, 10.0, 100.0]), burst=st.integers(1, 10), n=st.integers(1, 200))
def test_a_client_within_the_rate_is_never_refused(rate: float, burst: int, n: int) -> None:
    clock = Clock()
    limiter = PartnerLimiter(clock)
    partner = Partner("p", "P", limits=PartnerLimits(1000, rate, burst))
    for _ in range(n):
        limiter.acquire(partner)
        limiter.release(partner)
        clock.now += 1.0 / rate


@settings(max_examples=100, deadline=None)
@given(rate=st.sampled_from([0.2, 1.0, 3.0, 50.0]), burst=st.integers(1, 5))
def test_retry_after_is_enough(rate: float, burst: int) -> None:
    clock = Clock()
    limiter = PartnerLimiter(clock)
    partner = Partner("p", "P", limits=PartnerLimits(1000, rate, burst))
    for _ in range(burst):
        limiter.acquire(partner)
        limiter.release(partner)
    with pytest.raises(RateLimitedError) as info:
        limiter.acquire(partner)
    assert info.value.retry_after == max(1, math.ceil(1 / rate - 1e-9))
    clock.now += info.value.retry_after
    limiter.acquire(partner)  # honoured: it goes through


def test_requests_in_progress_are_capped_and_released() -> None:
    limiter = PartnerLimiter(Clock())
    a = Partner("a", "A", limits=PartnerLimits(2, 1e6, 10**6))
    b = Partner("b", "B", limits=PartnerLimits(2, 1e6, 10**6))
    limiter.acquire(a)
    limiter.acquire(a)
    with pytest.raises(ConcurrencyLimitedError) as info:
        limiter.acquire(a)
    assert info.value.retry_after == 1 and info.value.code == "too-many-concurrent-requests"
    assert "limits.concurrent_requests is 2" in info.value.detail
    limiter.acquire(b)  # another partner is not affected
    assert limiter.in_progress("a") == 2  # the refused one was not counted
    limiter.release(a)
    limiter.acquire(a)
    for _ in range(2):
        limiter.release(a)
    limiter.release(b)
    assert limiter.in_progress("a") == limiter.in_progress("b") == 0


# --------------------------------------------------------------------------- configuration


def _registry(text: str) -> PartnerRegistry:
    data = load_yaml(text=text, name="partners.yaml")
    return PartnerRegistry.from_mapping(data["partners"], data.get("defaults"))


KEY = (
    'keys: [{id: k1, hash: "scrypt$ln=14,r=8,p=1$4jwbSNf0dQ9WLW1Qc7j9SQ$tN1Ynkh6q/JddHkQZZsKWYS0uvOusUnN9USHQWHzeqU"}]'
)


def test_limits_come_from_the_partner_then_the_defaults_then_the_built_in_values() -> None:
    registry = _registry(f"""
defaults:
  limits: {{concurrent_requests: 20, requests_per_second: 5}}
partners:
  a: {{{KEY}, limits: {{burst: 3}}}}
  b: {{keys: []}}
""")
    assert registry.get("a").limits == PartnerLimits(20, 5.0, 3)
    assert registry.get("b").limits == PartnerLimits(20, 5.0, 5)  # burst: one second's worth
    assert _registry("partners:\n  c: {keys: []}\n").get("c").limits == DEFAULT_PARTNER_LIMITS


def test_the_refusal_delay_comes_from_the_partner_then_the_defaults() -> None:
    registry = _registry(f"""
defaults:
  limits: {{refusal_delay: 0.5}}
partners:
  a: {{{KEY}, limits: {{refusal_delay: 0}}}}
  b: {{keys: []}}
""")
    assert registry.get("a").limits.refusal_delay == 0.0
    assert registry.get("b").limits.refusal_delay == 0.5
    assert DEFAULT_PARTNER_LIMITS.refusal_delay == 0.25


async def test_a_refusal_is_answered_after_the_refusal_delay_and_an_admission_at_once() -> None:
    limiter = PartnerLimiter()
    slow = Partner("slow", "S", limits=PartnerLimits(1, 1e6, 10**6, 0.2))
    quick = Partner("quick", "Q", limits=PartnerLimits(1, 1e6, 10**6, 0.0))
    loop = asyncio.get_running_loop()
    for partner in (slow, quick):
        started = loop.time()
        await limiter.admit(partner)  # within its limits: admitted, counted, at once
        assert loop.time() - started < 0.1 and limiter.in_progress(partner.id) == 1
    started = loop.time()
    with pytest.raises(ConcurrencyLimitedError):
        await limiter.admit(slow)
    assert loop.time() - started >= 0.2 - 1e-3
    started = loop.time()
    with pytest.raises(ConcurrencyLimitedError):
        await limiter.admit(quick)
    assert loop.time() - started < 0.1
    assert limiter.in_progress("slow") == 1 and limiter.in_progress("quick") == 1  # refusals count nothing


async def test_a_refusal_waiting_out_its_delay_holds_no_slot() -> None:
    limiter = PartnerLimiter()
    partner = Partner("p", "P", limits=PartnerLimits(1, 1e6, 10**6, 0.3))
    await limiter.admit(partner)
    refused = asyncio.ensure_future(limiter.admit(partner))
    await asyncio.sleep(0.05)
    limiter.release(partner)  # the slot frees while the refusal waits: the next request is admitted at once
    await asyncio.wait_for(limiter.admit(partner), 0.1)
    with pytest.raises(ConcurrencyLimitedError):
        await refused


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("partners:\n  a:\n    keys: []\n    limits: {concurrent_requests: 0}\n", 4, "concurrent_requests"),
        ("partners:\n  a:\n    keys: []\n    limits:\n      requests_per_second: fast\n", 5, "requests_per_second"),
        ("partners:\n  a:\n    keys: []\n    limits:\n      burst: -1\n", 5, "burst"),
        ("partners:\n  a:\n    keys: []\n    limits:\n      per_minute: 5\n", 5, "unknown key 'per_minute'"),
        ("defaults:\n  limits:\n    requests_per_second: 0\npartners: {}\n", 3, "requests_per_second"),
        ("defaults:\n  rate: 1\npartners: {}\n", 2, "unknown key 'rate'"),
        ("partners:\n  a:\n    keys: []\n    limits:\n      refusal_delay: -0.1\n", 5, "refusal_delay"),
        ("partners:\n  a:\n    keys: []\n    limits:\n      refusal_delay: 1.5\n", 5, "from 0 to 1"),
        ("defaults:\n  limits:\n    refusal_delay: soon\npartners: {}\n", 3, "refusal_delay"),
        ("defaults:\n  limits:\n    refusal_delay: true\npartners: {}\n", 3, "refusal_delay"),
    ],
)
def test_bad_limits_are_reported_at_their_line(text: str, line: int, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        _registry(text)
    assert (info.value.file, info.value.line) == ("partners.yaml", line)
    assert words in info.value.detail


def test_the_partners_file_may_hold_defaults_beside_its_partners(tmp_path) -> None:
    (tmp_path / "partners.yaml").write_text(
        (REPO / "config" / "partners.yaml").read_text().replace("concurrent_requests: 32 ", "concurrent_requests: 7 ")
    )
    main = tmp_path / "b2bgw.yaml"
    main.write_text("partners: partners.yaml\n")
    settings = settings_from_mapping(load_yaml(main), config_path=main)
    registry = PartnerRegistry.from_settings(settings)
    assert {p.limits.concurrent_requests for p in registry.partners.values()} == {7}


# --------------------------------------------------------------------------- over HTTP


@pytest.fixture
def limited(make_assembly, tmp_path):
    """A gateway whose partner globex may have 2 requests in progress and send one request every 2 s after a
    burst of 3."""
    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

    data = sample_data(tmp_path)
    data["partners"]["globex"]["limits"] = {"concurrent_requests": 2, "requests_per_second": 0.5, "burst": 3}
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    try:
        yield app
    finally:
        runtime.stop()


async def test_over_the_rate_is_429_with_retry_after_and_other_partners_go_on(limited):
    transport = httpx.ASGITransport(app=limited)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw.test") as client:
        answers = [
            await client.post("/v1/documents", content=with_id(INVOICE, f"R{i}"), headers=GLOBEX) for i in range(3)
        ]
        assert [a.status_code for a in answers] == [202, 202, 202]
        started = asyncio.get_running_loop().time()
        refused = await client.post("/v1/documents", content=with_id(INVOICE, "R3"), headers=GLOBEX)
        assert asyncio.get_running_loop().time() - started >= DEFAULT_PARTNER_LIMITS.refusal_delay - 1e-3
        assert refused.status_code == 429
        assert refused.headers["content-type"] == "application/problem+json"
        assert int(refused.headers["retry-after"]) >= 1
        body = refused.json()
        assert body["code"] == "rate-limited" and body["retry_after"] == int(refused.headers["retry-after"])
        assert (await client.get("/v1/documents/none", headers=GLOBEX)).status_code == 429  # GETs count too
        other = await client.post("/v1/documents", content=with_id(ORDER, "OTHER-1"), headers=ACME)
        assert other.status_code in (200, 504)  # acme's order goes in (no back end answers it here: 504)


async def test_over_the_requests_in_progress_is_429_before_the_body_is_read(limited):
    transport = httpx.ASGITransport(app=limited)
    release = asyncio.Event()
    pulled: list[int] = []

    async def slow_body(tag: int):
        pulled.append(tag)
        yield INVOICE[:100]
        await release.wait()
        yield INVOICE[100:]

    async with httpx.AsyncClient(transport=transport, base_url="http://gw.test", timeout=30) as client:
        held = [
            asyncio.create_task(client.post("/v1/documents", content=slow_body(i), headers=GLOBEX)) for i in range(2)
        ]
        while len(pulled) < 2:
            await asyncio.sleep(0.01)
        third = await client.post("/v1/documents", content=slow_body(3), headers=GLOBEX)
        assert third.status_code == 429 and third.json()["code"] == "too-many-concurrent-requests"
        assert third.headers["retry-after"] == "1"
        release.set()
        answers = await asyncio.gather(*held)
        assert [a.status_code for a in answers] == [202, 202]  # the same invoice: accepted, then replayed
        again = await client.post("/v1/documents", content=with_id(INVOICE, "AGAIN"), headers=GLOBEX)
        assert again.status_code == 202


def test_the_default_limits_bound_what_one_partner_keeps_in_flight() -> None:
    from gateway.config.loader import load_settings

    settings = load_settings(SAMPLE_CONFIG)
    registry = PartnerRegistry.from_settings(settings)
    for limits in [DEFAULT_PARTNER_LIMITS] + [p.limits for p in registry.partners.values()]:
        # one partner's requests in progress hold at most this many bodies: well under a gigabyte
        assert limits.concurrent_requests * settings.limits.max_bytes <= 512 * 1024 * 1024
        assert limits.requests_per_second <= 1000
