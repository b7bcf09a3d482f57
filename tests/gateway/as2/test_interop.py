"""Interoperability with libas2 (npm), an AS2 implementation nobody here wrote, in both directions.

libas2 sends us signed and encrypted messages asking for signed synchronous and asynchronous MDNs and verifies
our MDNs; we send to libas2's receiver and verify its MDNs. The MICs are checked against ``openssl cms``:
decrypting libas2's message independently and hashing the part it signed.

Node runs with ``--security-revert=CVE-2023-46809``: Node 20 refuses RSA PKCS #1 v1.5 decryption (the Marvin
attack) without it, and PKCS #1 v1.5 is the key transport the gateway (like most AS2 software) sends. The
tests skip only where Node or the installed libas2 is absent (``scripts/test`` runs ``npm ci`` here).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import ipaddress
import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from as2kit import OUR_ID, as2_data, run
from gwtest import INVOICE, ORDER

pytestmark = pytest.mark.anyio

INTEROP = Path(__file__).resolve().parent / "interop"
SCRIPT = INTEROP / "as2node.js"
NODE = shutil.which("node")
if NODE is None or not (INTEROP / "node_modules" / "libas2").is_dir():
    pytest.skip(
        "libas2 interop needs Node 20 and `npm ci` in tests/gateway/as2/interop (scripts/test runs it)",
        allow_module_level=True,
    )
NODE_ARGS = [NODE, "--security-revert=CVE-2023-46809", str(SCRIPT)]  # PKCS #1 v1.5 key transport, see above


def node(command: str, options: dict) -> dict:
    out = subprocess.run(NODE_ARGS + [command], input=json.dumps(options).encode(), capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    return json.loads(_json_lines(out.stdout.splitlines())[-1])


def _json_lines(lines) -> list:
    """Node prints its "SECURITY WARNING: Reverting CVE-2023-46809" line on stdout: the JSON lines only."""
    return [line for line in lines if line.lstrip().startswith(b"{")]


def _first_json(stream) -> dict:
    for line in stream:
        if line.lstrip().startswith(b"{"):
            return json.loads(line)
    raise AssertionError("the libas2 receiver did not start")


def libas2_options(pki, **extra) -> dict:
    return {
        "hostId": "GLOBEX-AS2",
        "hostCert": pki.globex.cert.read_text(),
        "hostKey": pki.globex.key.read_text(),
        "partnerId": OUR_ID,
        "partnerCert": pki.ours.cert.read_text(),
        **extra,
    }


def independent_mic(pki, headers: dict, body: bytes) -> str:
    """The MIC of libas2's message by RFC 4130 7.3.1, worked out with ``openssl cms -decrypt`` (not our code)."""
    smime = "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower().startswith("content-")).encode()
    signed = run(
        "openssl",
        "cms",
        "-decrypt",
        "-binary",
        "-recip",
        str(pki.ours.cert),
        "-inkey",
        str(pki.ours.key),
        data=smime + b"\r\n" + body,
    )
    head, _, rest = signed.partition(b"\r\n\r\n")
    boundary = head.split(b"boundary=")[1].split(b";")[0].strip().strip(b'"')
    first = rest.split(b"--" + boundary)[1]
    first = first[first.index(b"\n") + 1 :]
    first = first[:-2] if first.endswith(b"\r\n") else first[:-1]
    return base64.b64encode(hashlib.sha256(first).digest()).decode()


@pytest.mark.parametrize("encrypt", ["aes256-CBC", "aes128-GCM"])
async def test_libas2_sends_us_a_signed_encrypted_message_and_verifies_our_signed_mdn(as2_env, as2_pki, encrypt):
    message = node("compose", libas2_options(as2_pki, payload=base64.b64encode(INVOICE).decode(), encrypt=encrypt))
    body = base64.b64decode(message["body"])
    response = await as2_env.client.post("/as2", content=body, headers=message["headers"])
    assert response.status_code == 200, response.text
    verdict = node(
        "verify-mdn",
        {
            "headers": {"Content-Type": response.headers["content-type"]},
            "body": base64.b64encode(response.content).decode(),
            "cert": as2_pki.ours.cert.read_text(),
        },
    )
    assert verdict["signed"] and verdict["processed"] and verdict["description"] is None
    assert verdict["originalMessageId"] == message["headers"]["Message-ID"]
    if encrypt.endswith("CBC"):  # openssl cannot open PKIjs's AES-GCM (a bare nonce for GCMParameters); we can
        assert verdict["mic"] == independent_mic(as2_pki, message["headers"], body)
    else:
        assert verdict["mic"]
    assert verdict["algorithm"] == "sha-256"
    rows = as2_env.ledger_rows()
    assert len(rows) == 1 and rows[0].document == INVOICE


class _Capture(http.server.BaseHTTPRequestHandler):
    received: list[tuple[dict, bytes]] = []

    def do_POST(self) -> None:  # http.server's name
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).received.append((dict(self.headers.items()), body))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def capture():
    handler = type("Capture", (_Capture,), {"received": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mdn", handler.received
    finally:
        server.shutdown()
        server.server_close()


async def _wait_for(items: list, seconds: float = 30.0) -> None:
    for _ in range(int(seconds * 20)):
        if items:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("nothing arrived")


async def test_libas2_asks_for_an_async_mdn_and_verifies_it(as2_env_factory, tmp_path, as2_pki, capture):
    """The asynchronous MDN goes to libas2's URL, which globex's agreement lists (its address is allowed)."""
    url, received = capture
    data = as2_data(tmp_path, as2_pki, async_mdn_urls=[url], async_mdn_allow_addresses=["127.0.0.1/32"])
    async for env in as2_env_factory(data):
        await _libas2_async_mdn(env, as2_pki, url, received)


async def _libas2_async_mdn(as2_env, as2_pki, url, received) -> None:
    message = node(
        "compose", libas2_options(as2_pki, payload=base64.b64encode(INVOICE).decode(), **{"async": True}, asyncUrl=url)
    )
    message["headers"]["Receipt-Delivery-Option"] = url
    response = await as2_env.client.post("/as2", content=base64.b64decode(message["body"]), headers=message["headers"])
    assert response.status_code == 200 and response.content == b""
    await _wait_for(received)
    headers, body = received[0]
    assert headers["AS2-To"] == "GLOBEX-AS2" and headers["AS2-From"] == OUR_ID
    verdict = node(
        "verify-mdn",
        {
            "headers": {"Content-Type": headers["Content-Type"]},
            "body": base64.b64encode(body).decode(),
            "cert": as2_pki.ours.cert.read_text(),
        },
    )
    assert verdict["signed"] and verdict["processed"]
    assert verdict["originalMessageId"] == message["headers"]["Message-ID"]


@pytest.fixture
def libas2_receiver(as2_pki, tmp_path):
    """libas2 as the receiving partner (GLOBEX-AS2) on a local port; yields (url, its stdout lines)."""
    options = tmp_path / "receiver.json"
    options.write_text(json.dumps(libas2_options(as2_pki)))
    process = subprocess.Popen(NODE_ARGS + ["serve", str(options)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        first = _first_json(process.stdout)
        lines: list[dict] = []
        reader = threading.Thread(
            target=lambda: [
                lines.append(json.loads(line)) for line in process.stdout if line.lstrip().startswith(b"{")
            ],
            daemon=True,
        )
        reader.start()
        yield f"http://127.0.0.1:{first['port']}/as2", lines
    finally:
        process.terminate()
        process.wait(timeout=10)


def _endpoint(pki, url: str, **changes):
    from cryptography import x509

    from gateway.as2.outbound import As2Endpoint
    from gateway.delivery.addresses import AddressPolicy

    cert = x509.load_pem_x509_certificate(pki.globex.cert.read_bytes())
    loopback = AddressPolicy(allow=(ipaddress.ip_network("127.0.0.0/8"),))  # the partner runs on this machine
    return As2Endpoint(url, "GLOBEX-AS2", (cert,), cert, addresses=loopback, **changes)


def _ours(pki, key_of=None):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from gateway.as2.cms import Identity
    from gateway.as2.config import As2Settings

    key = serialization.load_pem_private_key((key_of or pki.ours).key.read_bytes(), None)
    return As2Settings(OUR_ID, Identity(key, x509.load_pem_x509_certificate(pki.ours.cert.read_bytes())))


def _request(delivery_id="d-1"):
    from gateway.as2.outbound import OutboundRequest

    return OutboundRequest(delivery_id, "globex", "as2", ORDER, "application/xml", 1, 30.0)  # 8-bit: non-ASCII


async def test_we_send_to_libas2_and_verify_its_signed_mdn(as2_pki, libas2_receiver):
    from gateway.as2.outbound import send_message

    url, lines = libas2_receiver
    result = await send_message(_endpoint(as2_pki, url), _ours(as2_pki), _request())
    assert result.outcome == "delivered", result.detail
    assert result.evidence and b"multipart/signed" in result.evidence
    await _wait_for(lines)
    # libas2's parser keeps the CRLF that RFC 2046 gives to the next boundary delimiter, and hands the content
    # decoded to characters, which come out one byte each (latin-1)
    received = base64.b64decode(lines[0]["received"]).removesuffix(b"\r\n")
    assert received.decode("latin-1").encode("utf-8") == ORDER


async def test_a_negative_mdn_from_libas2_is_a_failed_delivery(as2_pki, libas2_receiver):
    from gateway.as2.outbound import send_message

    url, _ = libas2_receiver
    # signed with a key that is not the certificate's: libas2's verification fails, its MDN says so
    result = await send_message(_endpoint(as2_pki, url), _ours(as2_pki, key_of=as2_pki.stranger), _request("d-2"))
    assert result.outcome == "failed" and "negative MDN" in result.detail


async def test_an_mdn_with_another_mic_is_a_failed_delivery(as2_pki, libas2_receiver):
    from gateway.as2 import mdn as mdns
    from gateway.as2.outbound import judge, send_message

    url, _ = libas2_receiver
    endpoint = _endpoint(as2_pki, url)
    result = await send_message(endpoint, _ours(as2_pki), _request("d-3"))
    head, _, body = result.evidence.partition(b"\r\n\r\n")
    mdn = mdns.parse_mdn(head.decode().split(":", 1)[1].strip(), body, list(endpoint.certificates), require_signed=True)
    other = judge(mdn, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=, sha-256", endpoint, result.evidence, 200)
    assert other.outcome == "failed" and "MIC mismatch" in other.detail


async def test_an_async_mdn_from_libas2_is_matched_by_original_message_id(as2_env, as2_pki, tmp_path, capture):
    """We send to libas2 asking for an asynchronous MDN; it posts the MDN to our URL (captured here and handed
    to the gateway's /as2), which verifies it, keeps it in the ledger and completes the attempt."""
    from gateway.as2.outbound import send_message
    from gateway.as2.store import As2Store

    url, received = capture
    options = tmp_path / "receiver.json"
    options.write_text(json.dumps(libas2_options(as2_pki)))
    process = subprocess.Popen(NODE_ARGS + ["serve", str(options)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        port = _first_json(process.stdout)["port"]
        store = As2Store(as2_env.broker.engine, as2_env.broker)
        endpoint = _endpoint(as2_pki, f"http://127.0.0.1:{port}/as2", mdn="async", mdn_url=url)
        sending = asyncio.create_task(send_message(endpoint, _ours(as2_pki), _request("d-async"), store=store))
        await _wait_for(received)
        headers, body = received[0]
        answer = await as2_env.client.post("/as2", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        result = await asyncio.wait_for(sending, 30)
        assert result.outcome == "delivered", result.detail
        record = store.get("out", "globex", f"<d-async@{OUR_ID}>")
        assert record.disposition and record.disposition.endswith("processed") and record.mdn
    finally:
        process.terminate()
        process.wait(timeout=10)
