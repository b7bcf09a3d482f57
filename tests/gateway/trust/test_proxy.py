"""Behind a reverse proxy: Debian's nginx terminating mutual TLS in front of the gateway (the recipe of
docs/security.md), the partner identified by the escaped certificate nginx forwards; the same headers from
any address not in ``server.trusted_proxies`` ignored. Forwarded / X-Forwarded-For / XFCC parsing."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
from gwtest import ACME_KEY, ORDER_CHANGE, with_id
from trust_helpers import Served, free_port, make_pki, trust_config

from gateway.trust.peer import forwarded_certificate, forwarded_client

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
PROXIES = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8"))

#: The recipe's server block (docs/security.md), with the test's paths and ports filled in.
NGINX_CONF = """
daemon off;
master_process off;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream b2bgw {{ server 127.0.0.1:{upstream}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {pki}/server-chain.pem;
        ssl_certificate_key {pki}/server-key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_client_certificate {pki}/client-ca.pem;
        ssl_verify_client optional;
        client_max_body_size 10m;
        location / {{
            proxy_pass http://b2bgw;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-SSL-Client-Cert $ssl_client_escaped_cert;
        }}
    }}
}}
"""


@pytest.fixture(scope="module")
def behind_nginx(tmp_path_factory):
    if NGINX is None:
        pytest.skip("nginx is not installed (scripts/test installs Debian's nginx)")
    tmp = tmp_path_factory.mktemp("proxy")
    pki = make_pki(tmp / "pki")
    config, keys = trust_config(tmp, pki, server={"trusted_proxies": ["127.0.0.1"], "client_cert_header": "nginx"})
    gateway = Served(tmp, config, scheme="http")
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, pki=pki.dir, port=port, upstream=gateway.port))
    nginx = None
    try:
        gateway.wait_ready()
        nginx = subprocess.Popen(
            [NGINX, "-p", str(tmp), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with _client(pki, source="127.0.0.1") as c:
                    c.get(f"https://127.0.0.1:{port}/healthz", timeout=2)
                break
            except httpx.HTTPError:
                assert nginx.poll() is None, nginx.stderr.read().decode(errors="replace")
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.2)
        yield gateway, pki, keys, f"https://127.0.0.1:{port}"
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(20)
        gateway.stop()


def _client(pki, cert: Path | None = None, source: str = "127.0.0.3") -> httpx.Client:
    import ssl

    ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(str(cert))
    return httpx.Client(verify=ctx, timeout=30, transport=httpx.HTTPTransport(verify=ctx, local_address=source))


def _order() -> bytes:
    return with_id(ORDER_CHANGE, f"PROXY-{time.time_ns()}")


def test_a_partner_is_identified_by_the_certificate_nginx_forwards(behind_nginx):
    gateway, pki, _, proxy = behind_nginx
    with _client(pki, pki.client("initech")) as c:
        r = c.post(f"{proxy}/v1/documents", content=_order(), headers={"Content-Type": "application/xml"})
    assert r.status_code == 202, r.text
    with _client(pki, pki.client("stranger")) as c:  # valid, but pinned to no partner
        r = c.post(f"{proxy}/v1/documents", content=_order(), headers={"Content-Type": "application/xml"})
    assert r.status_code == 401


def test_a_certificate_pinned_to_another_partner_through_nginx_is_401(behind_nginx):
    gateway, pki, _, proxy = behind_nginx
    with _client(pki, pki.client("globex")) as c:
        r = c.post(
            f"{proxy}/v1/documents",
            content=_order(),
            headers={"Content-Type": "application/xml", "Authorization": f"Bearer {ACME_KEY}"},
        )
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_the_client_address_is_what_nginx_saw_not_what_the_client_wrote(behind_nginx):
    gateway, pki, _, proxy = behind_nginx
    with _client(pki, source="127.0.0.3") as c:
        r = c.get(f"{proxy}/healthz?from-proxy", headers={"X-Forwarded-For": "203.0.113.9"})
    assert r.status_code == 200
    deadline = time.monotonic() + 10
    line = ""
    while time.monotonic() < deadline and not line:
        line = next((ln for ln in gateway.log.read_text(errors="replace").splitlines() if "from-proxy" in ln), "")
        time.sleep(0.2)
    assert "127.0.0.3" in line and "203.0.113.9" not in line, line


def test_the_certificate_header_sent_directly_is_ignored(behind_nginx):
    gateway, pki, _, _ = behind_nginx
    escaped = urllib.parse.quote(pki.client("initech").read_text().split("-----END PRIVATE KEY-----")[-1].strip())
    assert "BEGIN%20CERTIFICATE" in escaped
    with httpx.Client(timeout=30, transport=httpx.HTTPTransport(local_address="127.0.0.2")) as c:
        r = c.post(
            f"{gateway.base}/v1/documents",
            content=_order(),
            headers={"Content-Type": "application/xml", "X-SSL-Client-Cert": escaped, "X-Forwarded-For": "127.0.0.1"},
        )
    assert r.status_code == 401


# --------------------------------------------------------------------------- parsing, without a proxy


def test_forwarded_takes_the_right_most_address_that_is_not_a_trusted_proxy():
    headers = {b"forwarded": b'for=198.51.100.7;proto=https, for="[2001:db8::1]:4711", for=10.1.2.3'}
    assert forwarded_client(headers, PROXIES) == ("2001:db8::1", None)
    headers = {b"forwarded": b"for=192.0.2.60;proto=https;by=203.0.113.43"}
    assert forwarded_client(headers, PROXIES) == ("192.0.2.60", "https")
    headers = {b"x-forwarded-for": b"1.2.3.4, 198.51.100.7, 10.0.0.9", b"x-forwarded-proto": b"https"}
    assert forwarded_client(headers, PROXIES) == ("198.51.100.7", "https")
    assert forwarded_client({b"x-forwarded-for": b"not-an-address"}, PROXIES) == (None, None)
    assert forwarded_client({b"forwarded": b"for=unknown;proto=gopher"}, PROXIES) == (None, None)


def test_a_huge_forwarded_header_is_cut_to_the_last_hops():
    value = (b"1.1.1.1, " * 100_000) + b"198.51.100.7"
    started = time.process_time()
    assert forwarded_client({b"x-forwarded-for": value}, PROXIES)[0] == "198.51.100.7"
    assert time.process_time() - started < 5  # bounded work, however long (generous on a loaded machine)


def test_envoy_xfcc_gives_the_nearest_clients_certificate(tmp_path):
    pki = make_pki(tmp_path / "pki")
    pem = pki.client("initech").read_text().split("-----END PRIVATE KEY-----")[-1].strip() + "\n"
    quoted = urllib.parse.quote(pem, safe="")
    value = (
        f"By=spiffe://outer;Hash={'0' * 64},"
        f'By=spiffe://b2bgw;Hash={"a" * 64};Cert="{quoted}";Subject="CN=initech.example"'
    ).encode()
    cert = forwarded_certificate({b"x-forwarded-client-cert": value}, "envoy")
    assert cert is not None and cert.subject is not None
    assert (
        cert.subject.rfc4514_string().startswith("CN=initech.example")
        or "initech.example" in cert.subject.rfc4514_string()
    )
    only_hash = forwarded_certificate({b"x-forwarded-client-cert": f"Hash={'b' * 64}".encode()}, "envoy")
    assert only_hash is not None and only_hash.sha256 == "b" * 64
    assert forwarded_certificate({b"x-forwarded-client-cert": b"x" * 70_000}, "envoy") is None
