"""HTTPS on the partner API (``server.tls``), client certificates as partner identity, key windows: each case
over a real TLS connection to ``b2bgw serve`` (httpx, and ``openssl s_client`` from outside)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time

import httpx
import pytest
from gwtest import ACME_KEY, GLOBEX_KEY, ORDER_CHANGE, with_id
from trust_helpers import Served, fingerprint, make_pki, trust_config

from gateway.trust.peer import PeerCertificate

XML = {"Content-Type": "application/xml"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(tmp / "pki")
    config, keys = trust_config(tmp, pki)
    server = Served(tmp, config, ca=pki.dir / "ca.pem")
    try:
        server.wait_ready()
        yield server, pki, keys
    finally:
        server.stop()


_n = iter(range(1_000_000))


def _order() -> bytes:
    return with_id(ORDER_CHANGE, f"TLS-{time.time_ns()}-{next(_n)}")


def _post(server: Served, headers: dict[str, str], cert=None) -> httpx.Response:
    with server.client(cert) as c:
        return c.post("/v1/documents", content=_order(), headers={**XML, **headers})


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_https_with_an_api_key_is_served(served):
    server, _, _ = served
    r = _post(server, _bearer(ACME_KEY))
    assert r.status_code == 202, r.text
    assert r.headers["x-message-id"]


def test_the_certificate_served_chains_to_the_ca_and_names_the_host(served):
    server, pki, _ = served
    with socket_tls(server, pki) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert tls.getpeercert()["subjectAltName"]


def socket_tls(server, pki, **kw):
    import contextlib
    import socket

    ctx = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    for name, value in kw.items():
        setattr(ctx, name, value)

    @contextlib.contextmanager
    def connect():
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                yield tls

    return connect()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
@pytest.mark.parametrize("flag, accepted", [("-tls1_1", False), ("-tls1_2", True), ("-tls1_3", True)])
def test_protocol_versions_from_openssl_s_client(served, flag, accepted):
    server, pki, _ = served
    args = [
        "openssl",
        "s_client",
        "-connect",
        f"127.0.0.1:{server.port}",
        flag,
        "-CAfile",
        str(pki.dir / "ca.pem"),
        "-verify_return_error",
        "-brief",
    ]
    if flag == "-tls1_1":
        args += ["-cipher", "DEFAULT:@SECLEVEL=0"]  # the client's own floor must not be what refuses
    done = subprocess.run(args, input=b"", capture_output=True, timeout=30)
    out = (done.stdout + done.stderr).decode(errors="replace")
    if accepted:
        assert done.returncode == 0, out
        assert f"Protocol version: TLSv1.{flag[-1]}" in out, out
    else:
        assert done.returncode != 0, out
        assert "Protocol version" not in out, out


def test_tls_1_2_offers_only_forward_secret_aead_suites(served):
    server, pki, _ = served
    with socket_tls(server, pki, maximum_version=ssl.TLSVersion.TLSv1_2) as tls:
        name, version, _bits = tls.cipher()
        assert version == "TLSv1.2"
        assert name.startswith("ECDHE-") and ("GCM" in name or "CHACHA20" in name), name
    weak = ssl.create_default_context(cafile=str(pki.dir / "ca.pem"))
    weak.maximum_version = ssl.TLSVersion.TLSv1_2
    weak.set_ciphers("ECDHE-ECDSA-AES128-SHA:ECDHE-RSA-AES128-SHA:AES128-SHA")  # CBC suites only
    import socket

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):
            weak.wrap_socket(raw, server_hostname="127.0.0.1")


def test_a_certificate_only_partner_needs_no_key(served):
    server, pki, _ = served
    r = _post(server, {}, cert=pki.client("initech"))
    assert r.status_code == 202, r.text


def test_a_certificate_only_partner_without_its_certificate_is_401(served):
    server, pki, keys = served
    r = _post(server, _bearer(keys.initech))
    assert r.status_code == 401
    assert r.json()["code"] == "unauthenticated"
    assert _post(server, {}).status_code == 401


def test_a_certificate_pinned_to_another_partner_is_refused_like_a_wrong_key(served):
    server, pki, _ = served
    wrong = _post(server, _bearer(ACME_KEY), cert=pki.client("globex"))
    bad_key = _post(server, _bearer(ACME_KEY[:-4] + "AAAA"))
    assert wrong.status_code == bad_key.status_code == 401
    assert wrong.json()["code"] == bad_key.json()["code"] == "unauthenticated"
    assert wrong.json()["detail"] == bad_key.json()["detail"]
    assert "globex" not in wrong.text and "acme" not in wrong.text


def test_a_key_with_its_own_pinned_certificate_is_served(served):
    server, pki, _ = served
    assert _post(server, _bearer(ACME_KEY), cert=pki.client("acme")).status_code == 202
    # a valid certificate no partner pinned does not stop a key-only partner
    assert _post(server, _bearer(GLOBEX_KEY), cert=pki.client("stranger")).status_code != 401


def test_both_policy_needs_the_key_and_the_certificate(served):
    server, pki, keys = served
    assert _post(server, _bearer(keys.umbrella)).status_code == 401
    assert _post(server, {}, cert=pki.client("umbrella")).status_code == 401
    assert _post(server, _bearer(keys.umbrella), cert=pki.client("acme")).status_code == 401
    assert _post(server, _bearer(keys.umbrella), cert=pki.client("umbrella")).status_code == 202


@pytest.mark.parametrize("name", ["expired", "foreign"])
def test_an_expired_or_foreign_client_certificate_fails_the_handshake(served, name):
    server, pki, _ = served
    with pytest.raises(httpx.HTTPError):  # the server's alert ends the connection: nothing is served
        r = _post(server, {}, cert=pki.client(name))
        raise AssertionError(f"answered {r.status_code}")  # pragma: no cover


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")
def test_a_client_certificate_through_openssl_s_client(served):
    server, pki, _ = served
    body = _order()
    request = (
        b"POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/xml\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    done = subprocess.run(
        [
            "openssl",
            "s_client",
            "-connect",
            f"127.0.0.1:{server.port}",
            "-quiet",
            "-CAfile",
            str(pki.dir / "ca.pem"),
            "-cert",
            str(pki.client("initech")),
            "-verify_return_error",
        ],
        input=request,
        capture_output=True,
        timeout=30,
    )
    assert done.stdout.startswith(b"HTTP/1.1 202"), done.stdout[:300] + done.stderr[-300:]


def test_a_key_outside_its_window_is_refused_as_expired(served):
    server, _, keys = served
    for key in (keys.expired, keys.future):
        r = _post(server, _bearer(key))
        assert r.status_code == 401
        body = r.json()
        assert body["code"] == "key-expired"
        assert "acme" not in r.text.lower()
    assert _post(server, _bearer(keys.current)).status_code == 202


def test_a_wrong_secret_for_an_expired_key_is_not_told_apart_from_any_wrong_key(served):
    server, _, keys = served
    r = _post(server, _bearer(keys.expired[:-4] + "AAAA"))
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"


def test_the_log_says_how_each_partner_was_authenticated(served):
    server, pki, _ = served
    assert _post(server, {}, cert=pki.client("initech")).status_code == 202
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = server.log.read_text(errors="replace")
        if "auth=certificate:sha256:" in text or '"auth": "certificate:sha256:' in text:
            break
        time.sleep(0.2)
    assert "certificate:sha256:" in text
    assert "key:acme-demo" in text


def _ledger_auth(server: Served, message_id: str) -> str | None:
    import sqlalchemy as sa

    from ledger_contract.tables import documents

    engine = sa.create_engine(f"sqlite:///{server.log.parent / 'gw.db'}")
    try:
        with engine.connect() as conn:
            return conn.execute(sa.select(documents.c.auth).where(documents.c.message_id == message_id)).scalar_one()
    finally:
        engine.dispose()


def _logged_with(server: Served, message_id: str) -> str:
    """The log lines about the request that *message_id* was accepted from."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in server.log.read_text(errors="replace").splitlines() if message_id in line]
        if lines or time.monotonic() > deadline:
            return "\n".join(lines)
        time.sleep(0.2)


def test_the_ledger_and_the_log_line_say_which_credential_sent_each_document(served):
    server, pki, keys = served
    by_key = _post(server, _bearer(ACME_KEY))
    by_cert = _post(server, {}, cert=pki.client("initech"))
    by_both = _post(server, _bearer(keys.umbrella), cert=pki.client("umbrella"))
    assert by_key.status_code == by_cert.status_code == by_both.status_code == 202
    initech = PeerCertificate.from_pem(pki.client("initech").read_text()).sha256
    umbrella = fingerprint(pki.client("umbrella"))
    expected = {
        by_key.headers["x-message-id"]: "key:acme-demo",
        by_cert.headers["x-message-id"]: f"certificate:sha256:{initech}",
        by_both.headers["x-message-id"]: f"key:umbrella-1+certificate:sha256:{umbrella}",
    }
    for message_id, auth in expected.items():
        assert _ledger_auth(server, message_id) == auth
        assert auth in _logged_with(server, message_id)
    text = server.log.read_text(errors="replace") + str(expected)
    assert ACME_KEY.split(".", 1)[1] not in text and keys.umbrella.split(".", 1)[1] not in text


def test_plain_http_to_the_https_listener_is_answered_clearly(served):
    import socket

    server, _, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"HTTPS" in answer and b"https://" in answer
    r = httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
    assert r.status_code == 400 and "HTTPS only" in r.text
