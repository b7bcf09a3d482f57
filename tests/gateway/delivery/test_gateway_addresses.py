"""The gateway-wide address lists (``delivery.allow_addresses`` / ``deny_addresses`` of the main configuration),
read from a real configuration and enforced by the engine against real sockets on loopback."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import socket

import pytest
from delivery_receiver import Receiver
from test_https_delivery import DOC, run

from broker_core import Broker
from gateway.config.loader import settings_from_mapping
from gateway.delivery import addresses
from gateway.delivery.addresses import AddressPolicy
from gateway.delivery.errors import BlockedAddressError
from gateway.delivery.records import upgrade_deliveries
from gateway.errors import ConfigError
from gateway.marked import load_yaml
from gateway.routing.partners import PartnerRegistry

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def broker(tmp_path):
    b = Broker.open(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade_deliveries(b.engine)
    yield b
    b.close()


def endpoints(tmp_path, delivery: str, endpoint: str) -> dict:
    """The partner acme's endpoints as the gateway reads them from its main configuration."""
    text = (
        f"store: {{url: 'sqlite:///{tmp_path / 'gw.db'}'}}\n{delivery}"
        f"partners:\n  acme:\n    endpoints:\n      main:\n{endpoint}"
        f"        secrets: [{SECRET}]\n        timeout: 2s\n        max_attempts: 3\n"
        "        backoff: {initial: 50ms, max: 100ms}\n"
    )
    settings = settings_from_mapping(load_yaml(text=text, name="b2bgw.yaml"), base_dir=tmp_path)
    return PartnerRegistry.from_settings(settings).partners["acme"].delivery.endpoints


def test_the_gateway_deny_list_wins_over_the_endpoints_allow(tmp_path, broker):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    try:
        configs = endpoints(
            tmp_path,
            "delivery:\n  deny_addresses: [127.0.0.0/8]\n",
            f"        url: https://127.0.0.1:{port}/in\n        allow_addresses: [127.0.0.1/32]\n",
        )
        [row] = run(broker, configs, [("main", DOC)])
        with pytest.raises(BlockingIOError):  # nothing ever connected
            listener.accept()
    finally:
        listener.close()
    assert row.status == "dead"
    [attempt] = row.timeline
    assert attempt.outcome == "failed" and attempt.status is None
    assert "127.0.0.1" in attempt.detail and "delivery.deny_addresses" in attempt.detail


def test_the_gateway_allow_list_reaches_a_loopback_receiver(tmp_path, broker):
    receiver = Receiver(tmp_path)
    try:
        configs = endpoints(
            tmp_path,
            "delivery:\n  allow_addresses: [127.0.0.0/8]\n",
            f"        url: {receiver.url('/ok', '127.0.0.1')}\n        ca_bundle: {receiver.ca_file}\n",
        )
        [row] = run(broker, configs, [("main", DOC)])
        assert row.status == "delivered" and [a.outcome for a in row.timeline] == ["delivered"]
        [(_, body, _)] = receiver.requests["/ok"]
        assert body == DOC
    finally:
        receiver.close()


def test_without_the_gateway_lists_loopback_stays_refused(tmp_path, broker):
    receiver = Receiver(tmp_path)
    try:
        configs = endpoints(
            tmp_path, "", f"        url: {receiver.url('/ok', '127.0.0.1')}\n        ca_bundle: {receiver.ca_file}\n"
        )
        [row] = run(broker, configs, [("main", DOC)])
        assert row.status == "dead" and "allow_addresses" in row.last_detail
        assert receiver.requests["/ok"] == []
    finally:
        receiver.close()


@pytest.mark.parametrize("key", ["allow_addresses", "deny_addresses"])
def test_a_wrong_entry_is_named_with_its_line(tmp_path, key):
    text = f"delivery:\n  {key}:\n    - 10.0.0.0/8\n    - 300.1.2.3/8\n"
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(load_yaml(text=text, name="b2bgw.yaml"), base_dir=tmp_path)
    assert f"delivery.{key}" in caught.value.detail and "300.1.2.3/8" in caught.value.detail
    assert caught.value.line == 4


def test_an_unknown_key_of_the_section_is_refused(tmp_path):
    with pytest.raises(ConfigError) as caught:
        settings_from_mapping(load_yaml(text="delivery:\n  allow: [10.0.0.0/8]\n", name="b2bgw.yaml"))
    assert "allow" in caught.value.detail


@pytest.mark.parametrize(("ttl", "lookups"), [(5.0, 1), (0.0, 3)])
def test_a_host_is_resolved_once_within_the_ttl_and_checked_every_time(monkeypatch, ttl, lookups):
    calls = []

    async def getaddrinfo(self, host, port, **kw):
        calls.append((host, port))
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port))]

    monkeypatch.setattr(asyncio.BaseEventLoop, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(addresses, "_RESOLVED", {})
    monkeypatch.setattr(addresses, "RESOLVE_TTL", ttl)
    allowed = AddressPolicy(allow=(ipaddress.ip_network("10.0.0.0/8"),))
    denied = allowed.within(AddressPolicy(deny=(ipaddress.ip_network("10.1.0.0/16"),)))

    async def attempts() -> None:
        assert await allowed.resolve("partner.example", 443) == "10.1.2.3"
        assert await allowed.resolve("partner.example", 443) == "10.1.2.3"
        with pytest.raises(BlockedAddressError, match="delivery.deny_addresses"):
            await denied.resolve("partner.example", 443)

    asyncio.run(attempts())
    assert calls == [("partner.example", 443)] * lookups
