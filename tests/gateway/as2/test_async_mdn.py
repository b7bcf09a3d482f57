"""Asynchronous MDNs go only where the partner's agreement allows (RFC 4130 7.3, Receipt-Delivery-Option).

The URL comes with the message, so it is the sender's choice: a URL not among the partner's
``as2.async_mdn_urls``, or one whose host is (or resolves to) a private, loopback or link-local address the
agreement does not allow, is never connected to. The message itself is processed once all the same, and the
ledger's AS2 record says why no MDN was sent.
"""

from __future__ import annotations

import asyncio
import http.server
import socket
import threading

import pytest
from as2kit import OUR_ID, as2_data, disposition_of, openssl_verify_mdn
from gwtest import INVOICE
from test_inbound import post_as2, signed_encrypted

from gateway.as2.store import As2Store
from gateway.delivery.records import DeliveryLedger, DeliveryRow

pytestmark = pytest.mark.anyio


@pytest.fixture
def listener():
    """A listening socket on 127.0.0.1 that nobody should connect to: its URL, and a check that nobody did."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)

    def connected() -> bool:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mdn", connected
    finally:
        sock.close()


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


async def settled(env, message_id: str):
    """The AS2 record once its MDN's way is decided (queued as a delivery, or not sent and why)."""
    store = As2Store(env.broker.engine, env.broker)
    for _ in range(400):
        record = await asyncio.to_thread(store.get, "in", "globex", message_id)
        if record is not None and record.mdn_delivery and not record.mdn_delivery.startswith("queueing"):
            return record
        await asyncio.sleep(0.05)
    raise AssertionError(f"the MDN delivery of {message_id} was never noted")


async def delivery_of(env, record, status: str, timeout: float = 60.0) -> DeliveryRow:
    """The delivery the AS2 record says its MDN was queued as, once it has *status*."""
    assert record.mdn_delivery.startswith("queued as delivery "), record.mdn_delivery
    delivery_id = record.mdn_delivery.split()[3]
    ledger = DeliveryLedger(env.broker.engine)
    row = None
    for _ in range(int(timeout / 0.05)):
        row = await asyncio.to_thread(ledger.get, delivery_id, document=True)
        if row is not None and row.status == status:
            return row
        await asyncio.sleep(0.05)
    raise AssertionError(f"delivery {delivery_id} is not {status}: {row}")


async def post_with_async_url(env, pki, url: str):
    response, _, sent = await post_as2(env, signed_encrypted(pki, INVOICE)[0], async_url=url)
    assert response.status_code == 200 and response.content == b""
    return sent


async def test_a_url_not_in_the_agreement_is_never_connected_to(as2_env_factory, tmp_path, as2_pki, listener):
    url, connected = listener
    async for env in as2_env_factory(as2_data(tmp_path, as2_pki, async_mdn_urls=["https://partner.example/mdn"])):
        sent = await post_with_async_url(env, as2_pki, url)
        record = await settled(env, sent["Message-ID"])
        assert record.disposition == "processed" and record.mdn  # processed, its MDN kept
        assert record.mdn_delivery.startswith("not sent:") and "as2.async_mdn_urls" in record.mdn_delivery
        assert DeliveryLedger(env.broker.engine).list(partner="globex") == []  # nothing queued
        rows = env.ledger_rows()
        assert len(rows) == 1 and rows[0].message_id == record.message_id
        # a resend is answered the same way, and the document stays enqueued once
        again, _, _ = await post_as2(
            env, signed_encrypted(as2_pki, INVOICE)[0], async_url=url, message_id=sent["Message-ID"]
        )
        assert again.status_code == 200 and len(env.ledger_rows()) == 1
        assert env.depth(rows[0].destination.removeprefix("queue://")) == 1
    assert not connected()


async def test_without_async_mdn_urls_no_asynchronous_mdn_is_sent(as2_env, as2_pki, listener):
    url, connected = listener
    sent = await post_with_async_url(as2_env, as2_pki, url)
    record = await settled(as2_env, sent["Message-ID"])
    assert "none are configured" in record.mdn_delivery and len(as2_env.ledger_rows()) == 1
    assert not connected()


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "localhost", "169.254.169.254", "10.0.0.7", "[::1]"],
)
async def test_a_listed_url_on_a_private_address_is_never_connected_to(
    as2_env_factory, tmp_path, as2_pki, listener, host
):
    """Listing a URL is not enough: its address must be public or allowed (a name is resolved first)."""
    url, connected = listener
    port = url.split(":")[2].split("/")[0]
    target = f"http://{host}:{port}/mdn"
    async for env in as2_env_factory(as2_data(tmp_path, as2_pki, async_mdn_urls=[f"http://{host}:{port}/"])):
        sent = await post_with_async_url(env, as2_pki, target)
        record = await settled(env, sent["Message-ID"])
        assert record.disposition == "processed" and len(env.ledger_rows()) == 1
        assert record.mdn_delivery.startswith(f"not sent to {target}") and "private" in record.mdn_delivery
        assert DeliveryLedger(env.broker.engine).list(partner="globex") == []  # nothing queued
    assert not connected()


async def test_an_allowed_url_gets_the_signed_mdn(as2_env_factory, tmp_path, as2_pki, capture):
    url, received = capture
    data = as2_data(tmp_path, as2_pki, async_mdn_urls=[url], async_mdn_allow_addresses=["127.0.0.1/32"])
    async for env in as2_env_factory(data):
        sent = await post_with_async_url(env, as2_pki, url + "?id=1")
        record = await settled(env, sent["Message-ID"])
        assert record.mdn_delivery.startswith("queued as delivery ") and record.mdn_delivery.endswith(f"{url}?id=1")
        row = await delivery_of(env, record, "delivered")
        assert (row.partner, row.endpoint, row.kind) == ("globex", "as2-mdn", "as2-mdn")
        [(headers, body)] = received
        assert headers["AS2-From"] == OUR_ID and headers["AS2-To"] == "GLOBEX-AS2"
        report = openssl_verify_mdn(headers["Content-Type"], body, as2_pki.ours.cert)
        assert disposition_of(report).endswith("processed")
        assert record.mdn.endswith(body)  # the MDN posted is the one the ledger keeps


async def test_a_redirect_from_the_mdn_url_is_not_followed(as2_env_factory, tmp_path, as2_pki, listener):
    trap, connected = listener

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(307)
            self.send_header("location", trap)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/mdn"
    try:
        data = as2_data(tmp_path, as2_pki, async_mdn_urls=[url], async_mdn_allow_addresses=["127.0.0.1/32"])
        async for env in as2_env_factory(data):
            sent = await post_with_async_url(env, as2_pki, url)
            record = await settled(env, sent["Message-ID"])
            row = await delivery_of(env, record, "dead")  # a redirect is a permanent refusal
            [attempt] = row.timeline
            assert attempt.status == 307 and "not followed" in attempt.detail
    finally:
        server.shutdown()
        server.server_close()
    assert not connected()


def test_which_urls_an_agreement_allows():
    from gateway.as2.config import PartnerAgreement

    agreement = PartnerAgreement("p", "P", (), None, async_mdn_urls=("https://p.example/as2/mdn",))  # type: ignore[arg-type]
    allowed = agreement.async_mdn_refusal
    assert allowed("https://p.example/as2/mdn") is None
    assert allowed("https://P.EXAMPLE:443/as2/mdn/1") is None
    assert allowed("https://p.example/as2/mdn?id=1") is None
    for url in (
        "http://p.example/as2/mdn",  # another scheme
        "https://p.example:8443/as2/mdn",  # another port
        "https://p.example/as2/mdnx",  # not below the listed path
        "https://user:pw@p.example/as2/mdn",  # credentials
        "https://p.example.evil.test/as2/mdn",
        "mailto:edi@p.example",
    ):
        assert allowed(url) is not None, url


async def test_the_gateway_deny_list_wins_over_the_agreement(as2_env_factory, tmp_path, as2_pki, listener):
    """``delivery.deny_addresses`` is the gateway's own: an address an agreement allows is still never
    connected to when the gateway denies it."""
    url, connected = listener
    data = as2_data(tmp_path, as2_pki, async_mdn_urls=[url], async_mdn_allow_addresses=["127.0.0.1/32"])
    data["delivery"] = {"deny_addresses": ["127.0.0.0/8"]}
    async for env in as2_env_factory(data):
        sent = await post_with_async_url(env, as2_pki, url)
        record = await settled(env, sent["Message-ID"])
        assert record.disposition == "processed" and len(env.ledger_rows()) == 1
        assert record.mdn_delivery.startswith(f"not sent to {url}") and "delivery.deny_addresses" in record.mdn_delivery
        assert DeliveryLedger(env.broker.engine).list(partner="globex") == []  # nothing queued
    assert not connected()
