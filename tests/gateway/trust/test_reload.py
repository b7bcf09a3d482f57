"""The server certificate reloaded while serving: on file change and on SIGHUP, no request failing meanwhile,
and a broken pair never replacing a working one."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from gwtest import sample_data
from trust_helpers import Served, make_pki, plain


def _config(tmp: Path, pki, interval: str) -> Path:
    data = plain(sample_data(tmp))
    data["server"] = {
        **data.get("server", {}),
        "tls": {
            "certificate": str(pki.dir / "server-chain.pem"),
            "key": str(pki.dir / "server-key.pem"),
            "reload_interval": interval,
        },
    }
    path = tmp / "b2bgw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _served_cert(port: int, ca: Path) -> bytes:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert(binary_form=True)


def _replace(pki, leaf) -> None:
    """Write a new chain and key the way a certificate renewal tool does (each file replaced at once)."""
    for name, blobs in (("server-chain.pem", leaf.cert_chain_pems), ("server-key.pem", [leaf.private_key_pem])):
        tmp = pki.dir / f".{name}.new"
        tmp.write_bytes(b"".join(blob.bytes() for blob in blobs))
        os.replace(tmp, pki.dir / name)


def _wait_for(predicate, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_a_new_certificate_file_is_served_without_a_failed_request(tmp_path):
    pki = make_pki(tmp_path / "pki")
    server = Served(tmp_path, _config(tmp_path, pki, "200ms"), ca=pki.dir / "ca.pem")
    try:
        server.wait_ready()
        first = _served_cert(server.port, pki.dir / "ca.pem")
        stop = threading.Event()
        outcomes: list[int | str] = []

        def load(new_connections: bool) -> None:
            client = server.client()
            try:
                while not stop.is_set():
                    try:
                        if new_connections:
                            with server.client() as c:
                                outcomes.append(c.get("/healthz").status_code)
                        else:
                            outcomes.append(client.get("/healthz").status_code)
                    except httpx.HTTPError as exc:
                        outcomes.append(repr(exc))
            finally:
                client.close()

        threads = [threading.Thread(target=load, args=(flag,)) for flag in (True, False)]
        for t in threads:
            t.start()
        try:
            time.sleep(1.0)
            renewed = pki.ca.issue_cert("127.0.0.1", "localhost")
            _replace(pki, renewed)
            assert _wait_for(lambda: _served_cert(server.port, pki.dir / "ca.pem") != first), (
                "the new certificate was not served within 30 s"
            )
            time.sleep(1.0)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert outcomes and all(o == 200 for o in outcomes), [o for o in outcomes if o != 200][:5]
        assert len(outcomes) > 10
        assert _served_cert(server.port, pki.dir / "ca.pem") == ssl.PEM_cert_to_DER_cert(
            renewed.cert_chain_pems[0].bytes().decode()
        )
    finally:
        server.stop()


def test_sighup_reloads_and_a_broken_pair_keeps_the_old_certificate(tmp_path):
    pki = make_pki(tmp_path / "pki")
    server = Served(tmp_path, _config(tmp_path, pki, "0s"), ca=pki.dir / "ca.pem")  # no polling: SIGHUP only
    try:
        server.wait_ready()
        first = _served_cert(server.port, pki.dir / "ca.pem")
        # a key that does not belong to the chain: refused, the old pair still served
        (pki.dir / "server-key.pem").write_bytes(pki.ca.issue_cert("127.0.0.1").private_key_pem.bytes())
        server.proc.send_signal(signal.SIGHUP)
        assert _wait_for(lambda: "TLS certificate not reloaded" in server.log.read_text(errors="replace"))
        assert _served_cert(server.port, pki.dir / "ca.pem") == first
        assert server.proc.poll() is None
        renewed = pki.ca.issue_cert("127.0.0.1", "localhost")
        _replace(pki, renewed)
        time.sleep(0.5)
        assert _served_cert(server.port, pki.dir / "ca.pem") == first  # not polled: unchanged until SIGHUP
        server.proc.send_signal(signal.SIGHUP)
        expected = ssl.PEM_cert_to_DER_cert(renewed.cert_chain_pems[0].bytes().decode())
        assert _wait_for(lambda: _served_cert(server.port, pki.dir / "ca.pem") == expected)
    finally:
        server.stop()


@pytest.mark.parametrize("broken", ["missing", "mismatched"])
def test_a_tls_section_that_cannot_load_is_a_config_error_at_its_line(tmp_path, broken):
    from gateway.config.loader import load_settings
    from gateway.errors import ConfigError

    pki = make_pki(tmp_path / "pki")
    config = _config(tmp_path, pki, "5s")
    if broken == "missing":
        (pki.dir / "server-chain.pem").unlink()
    else:
        (pki.dir / "server-key.pem").write_bytes(pki.ca.issue_cert("x.example").private_key_pem.bytes())
    with pytest.raises(ConfigError) as caught:
        load_settings(config)
    text = str(caught.value)
    assert "b2bgw.yaml:" in text
    assert ("does not exist" in text) if broken == "missing" else ("do not load together" in text)
