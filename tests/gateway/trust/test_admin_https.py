"""The admin listener (``admin.port``) over HTTPS with ``server.tls``: the session cookie is Secure, answers
carry HSTS, plain HTTP is answered 400."""

from __future__ import annotations

import re
import time

import httpx
import yaml
from gwtest import sample_data
from trust_helpers import Served, free_port, make_pki, plain

from gateway.routing.partners import hash_key


def test_admin_listener_over_https_has_secure_cookies_and_hsts(tmp_path):
    pki = make_pki(tmp_path / "pki")
    admin_port = free_port()
    data = plain(sample_data(tmp_path))
    data["server"] = {
        **data.get("server", {}),
        "tls": {"certificate": str(pki.dir / "server-chain.pem"), "key": str(pki.dir / "server-key.pem")},
    }
    data["operators"] = {"alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)}}
    data["admin"] = {"port": admin_port}
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    server = Served(tmp_path, config, ca=pki.dir / "ca.pem")
    try:
        server.wait_ready()
        base = f"https://127.0.0.1:{admin_port}"
        deadline = time.monotonic() + 30
        with server.client() as c:
            while True:
                try:
                    r = c.post(f"{base}/admin/api/v1/session", json={"name": "alice", "secret": "alice-secret-1"})
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline, server.log.read_text()[-2000:]
                    time.sleep(0.3)
            assert r.status_code == 200, r.text
            cookie = r.headers["set-cookie"]
            assert re.search(r";\s*Secure", cookie), cookie
            assert "HttpOnly" in cookie
            assert r.headers["strict-transport-security"].startswith("max-age=")
            # the partner listener over HTTPS says the same
            assert c.get("/healthz").headers["strict-transport-security"].startswith("max-age=")
        plain_http = httpx.get(f"http://127.0.0.1:{admin_port}/healthz", timeout=10)
        assert plain_http.status_code == 400 and "HTTPS only" in plain_http.text
    finally:
        server.stop()
