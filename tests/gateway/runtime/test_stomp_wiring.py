"""The STOMP listener as `b2bgw serve` starts it from the `stomp:` section."""

from __future__ import annotations

import asyncio
import threading

import pytest
import stomp

from broker_core import Broker, Queue
from broker_core.stomp import StompLimits, hash_passcode
from gateway.errors import ConfigError
from gateway.runtime.serving import start_stomp, stomp_options


class _Settings:
    def __init__(self, stomp_section):
        self.stomp = stomp_section
        self.where = type("W", (), {"file": "b2bgw.yaml"})()


_ERP = {"erp": {"passcode_hash": hash_passcode("secret"), "consume": [], "browse": [], "send": ["/queue/orders.>"]}}


def test_defaults_are_loopback_on_61613():
    options = stomp_options(_Settings({"users": _ERP}))
    assert (options["host"], options["port"]) == ("127.0.0.1", 61613)
    assert [user.login for user in options["users"]] == ["erp"] and options["limits"] == StompLimits()


def test_no_users_is_a_config_error_that_says_how_to_add_one():
    for section in (None, {"host": "127.0.0.1"}, {"users": {}}):
        with pytest.raises(ConfigError, match="needs stomp.users.*passcode_file.*stomp.enabled: false"):
            stomp_options(_Settings(section))


def test_disabled_section_starts_nothing():
    assert stomp_options(_Settings({"enabled": False})) is None


def test_unknown_keys_are_a_config_error_naming_the_known_ones():
    with pytest.raises(
        ConfigError,
        match="known: enabled, heartbeat, host, limits, max_frame_size, port, prefetch, selector_string_numbers, tls, users",
    ):
        stomp_options(_Settings({"prot": 61613, "users": _ERP}))


def test_the_selector_string_numbers_choice_reaches_the_listener():
    options = stomp_options(_Settings({"selector_string_numbers": "strict", "users": _ERP}))
    assert options["selector_string_numbers"] == "strict"
    assert "selector_string_numbers" not in stomp_options(_Settings({"users": _ERP}))  # the broker's choice


def test_a_wrong_selector_string_numbers_choice_is_reported_at_its_line(tmp_path):
    from gateway.config.loader import settings_from_mapping

    with pytest.raises(ConfigError, match="stomp.selector_string_numbers must be one of convert, strict"):
        settings_from_mapping(
            {"store": {"url": "memory://"}, "stomp": {"selector_string_numbers": "loose"}},
            config_path=tmp_path / "b2bgw.yaml",
            base_dir=tmp_path,
        )


def test_a_listener_started_from_the_section_carries_messages_into_the_broker():
    broker = Broker.open("memory://", sweep_interval=0)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        holder["server"] = loop.run_until_complete(start_stomp(_Settings({"port": 0, "users": _ERP}), broker))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    server = holder["server"]
    try:
        client = stomp.Connection([("127.0.0.1", server.port)])
        client.connect("erp", "secret", wait=True)
        client.send("/queue/orders.inbound", "<Order/>", headers={"partner": "acme"})
        client.disconnect(receipt="bye")
        with broker.connect() as conn:
            conn.start()
            message = conn.create_session().create_consumer(Queue("orders.inbound")).receive(timeout=5)
        assert message is not None and message.get_string_property("partner") == "acme"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        broker.close()
