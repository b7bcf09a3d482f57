"""STOMP over TLS (``stomp.tls``, the keys of ``server.tls``): stomp.py connects, sends and receives over a
verified TLS connection; TLS 1.1 is refused from outside (``openssl s_client``); a client that speaks plain
STOMP to the TLS port gets no session; a bad section is a configuration error at its line."""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import threading
import time

import pytest
import stomp
from trust_helpers import make_pki

from broker_core import Broker, Queue
from broker_core.stomp import hash_passcode
from gateway.config.loader import settings_from_mapping
from gateway.errors import ConfigError
from gateway.runtime.serving import start_stomp

USERS = {"erp": {"passcode_hash": hash_passcode("secret"), "consume": ["/queue/>"], "send": ["/queue/>"]}}


def _settings(tmp_path, pki, **tls):
    section = {"certificate": str(pki.dir / "server-chain.pem"), "key": str(pki.dir / "server-key.pem"), **tls}
    return settings_from_mapping(
        {"store": {"url": "memory://"}, "stomp": {"port": 0, "users": USERS, "tls": section}},
        config_path=tmp_path / "b2bgw.yaml",
        base_dir=tmp_path,
    )


@pytest.fixture(scope="module")
def listener(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stomp-tls")
    pki = make_pki(tmp / "pki")
    settings = _settings(tmp, pki)
    broker = Broker.open("memory://", sweep_interval=0)
    loop = asyncio.new_event_loop()
    holder: dict = {}
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        holder["server"] = loop.run_until_complete(start_stomp(settings, broker))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    server = holder["server"]
    assert server is not None and server.ssl is not None
    try:
        yield server, pki, broker
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        broker.close()


def test_stomp_py_sends_and_receives_over_verified_tls(listener):
    server, pki, broker = listener
    received = []

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            received.append(frame.body)

    client = stomp.Connection12([("127.0.0.1", server.port)], heartbeats=(0, 0))
    client.set_ssl(for_hosts=[("127.0.0.1", server.port)], ca_certs=str(pki.dir / "ca.pem"))
    client.set_listener("l", Listener())
    client.connect("erp", "secret", wait=True)
    try:
        client.subscribe("/queue/tls.out", id="s1", ack="auto")
        client.send("/queue/tls.in", "<Order/>", headers={"partner": "acme"}, receipt="r1")
        with broker.connect() as conn:
            conn.start()
            message = conn.create_session().create_consumer(Queue("tls.in")).receive(timeout=5)
            assert message is not None and message.get_string_property("partner") == "acme"
            session = conn.create_session()
            session.create_producer(Queue("tls.out")).send(session.create_text_message("<Reply/>"))
        assert _wait(lambda: received == ["<Reply/>"]), received
    finally:
        client.disconnect()


def test_plain_stomp_to_the_tls_port_gets_no_session(listener):
    server, _, _ = listener
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"CONNECT\naccept-version:1.2\nlogin:erp\npasscode:secret\n\n\x00")
        sock.settimeout(5)
        answer = b""
        try:
            while chunk := sock.recv(4096):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    assert b"CONNECTED" not in answer


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
@pytest.mark.parametrize("flag, accepted", [("-tls1_1", False), ("-tls1_2", True), ("-tls1_3", True)])
def test_protocol_versions_from_openssl_s_client(listener, flag, accepted):
    server, pki, _ = listener
    args = ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", flag]
    args += ["-CAfile", str(pki.dir / "ca.pem"), "-verify_return_error", "-brief"]
    if flag == "-tls1_1":
        args += ["-cipher", "DEFAULT:@SECLEVEL=0"]  # the client's own floor must not be what refuses
    done = subprocess.run(args, input=b"", capture_output=True, timeout=30)
    out = (done.stdout + done.stderr).decode(errors="replace")
    if accepted:
        assert done.returncode == 0, out
        assert f"Protocol version: TLSv1.{flag[-1]}" in out, out
    else:
        assert done.returncode != 0 and "Protocol version" not in out, out


def test_a_key_that_does_not_match_its_certificate_is_refused_at_its_line(tmp_path):
    pki = make_pki(tmp_path / "pki")
    with pytest.raises(ConfigError, match=r"stomp\.tls: the certificate .* do not load together"):
        _settings(tmp_path, pki, key=str(pki.dir / "acme.pem"))
    with pytest.raises(ConfigError, match=r"unknown key 'certficate' in stomp\.tls"):
        settings_from_mapping(
            {"store": {"url": "memory://"}, "stomp": {"users": USERS, "tls": {"certficate": "x"}}},
            config_path=tmp_path / "b2bgw.yaml",
            base_dir=tmp_path,
        )


def test_the_certificate_is_reloaded_when_its_file_changes(tmp_path):
    pki = make_pki(tmp_path / "pki")
    settings = _settings(tmp_path, pki, reload_interval="0.2s")
    broker = Broker.open("memory://", sweep_interval=0)

    async def scenario() -> tuple[str, str]:
        server = await start_stomp(settings, broker)
        try:
            first = await asyncio.to_thread(_served_serial, server.port, pki)
            fresh = pki.ca.issue_cert("127.0.0.1", "localhost")
            fresh.private_key_pem.write_to_path(str(pki.dir / "server-key.pem"))
            fresh.cert_chain_pems[0].write_to_path(str(pki.dir / "server-chain.pem"))
            for _ in range(50):
                await asyncio.sleep(0.1)
                second = await asyncio.to_thread(_served_serial, server.port, pki)
                if second != first:
                    return first, second
            return first, first
        finally:
            await server.stop()

    try:
        first, second = asyncio.run(scenario())
    finally:
        broker.close()
    assert first != second


def _served_serial(port: int, pki) -> str:
    import ssl

    context = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert()["serialNumber"]


def _wait(predicate, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False
