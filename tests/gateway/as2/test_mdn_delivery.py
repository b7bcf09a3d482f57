"""Asynchronous MDNs are deliveries of the partner's ``as2-mdn`` endpoint: retried with backoff, kept with their
timeline, dead-lettered when the partner stays away, and replayable by an operator.

The receiver gets the MDN the ledger keeps, byte for byte, with its MIME headers as the request's headers
(RFC 4130 7.3: AS2-From and AS2-To of the MDN, its Message-ID, the multipart Content-Type with its boundary)
and none of the Standard Webhooks headers of ``https`` deliveries.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from types import SimpleNamespace

import pytest
import yaml
from as2kit import OUR_ID, as2_data, disposition_of, openssl_verify_mdn
from test_async_mdn import delivery_of, post_with_async_url, settled

from gateway.as2.config import PartnerAgreement
from gateway.as2.mdn_delivery import MDN_ENDPOINT, with_mdn_endpoint
from gateway.cli import main as cli
from gateway.delivery.config import parse_partner_delivery
from gateway.delivery.errors import UnknownEndpointError
from gateway.delivery.hooks import endpoint_of
from gateway.errors import ConfigError
from gateway.marked import load_yaml

pytestmark = pytest.mark.anyio

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo="
FAST = {"kind": "as2-mdn", "max_attempts": 3, "backoff": {"initial": "20ms", "max": "50ms"}}


class Receiver:
    """An MDN receiver on loopback answering 500 to the first *failures* requests (all when None), 200 after."""

    def __init__(self, failures: int | None) -> None:
        self.failures = failures
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                fail = receiver.failures is None or len(receiver.received) <= receiver.failures
                answer = b"down for maintenance" if fail else b""
                self.send_response(500 if fail else 200)
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/as2/mdn"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory():
    made: list[Receiver] = []

    def make(failures: int | None) -> Receiver:
        made.append(Receiver(failures))
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def mdn_data(tmp_path, pki, url: str, **endpoint):
    data = as2_data(tmp_path, pki, async_mdn_urls=[url], async_mdn_allow_addresses=["127.0.0.1/32"])
    data["partners"]["globex"]["endpoints"] = {MDN_ENDPOINT: {**FAST, **endpoint}}
    return data


async def test_an_mdn_refused_twice_is_delivered_on_the_third_attempt(
    as2_env_factory, tmp_path, as2_pki, receiver_factory
):
    receiver = receiver_factory(failures=2)
    async for env in as2_env_factory(mdn_data(tmp_path, as2_pki, receiver.url)):
        # the partners have no endpoints of their own: the engine runs for the MDNs alone
        assert list(env.runtime.delivery.lanes) == [("globex", MDN_ENDPOINT)]
        sent = await post_with_async_url(env, as2_pki, receiver.url)
        record = await settled(env, sent["Message-ID"])
        row = await delivery_of(env, record, "delivered")
        assert [(a.attempt, a.outcome, a.status) for a in row.timeline] == [
            (1, "retry", 500),
            (2, "retry", 500),
            (3, "delivered", 200),
        ]
        assert "down for maintenance" in row.timeline[0].detail
        assert row.document == record.mdn  # the delivery carries the MDN the ledger keeps
        assert len(receiver.received) == 3
        head, _, body = record.mdn.partition(b"\r\n\r\n")
        kept = dict(line.decode("latin-1").split(": ", 1) for line in head.split(b"\r\n"))
        for headers, posted in receiver.received:
            assert posted == body  # the exact signed bytes, on every attempt
            assert headers["as2-from"] == OUR_ID and headers["as2-to"] == "GLOBEX-AS2"
            assert headers["as2-version"] == "1.2" and headers["mime-version"] == "1.0"
            assert headers["message-id"] == kept["Message-ID"] != sent["Message-ID"]
            assert headers["content-type"] == kept["Content-Type"]
            assert headers["content-type"].startswith("multipart/signed") and "boundary=" in headers["content-type"]
            assert not [name for name in headers if name.startswith("webhook-")]
        report = openssl_verify_mdn(receiver.received[-1][0]["content-type"], body, as2_pki.ours.cert)
        assert disposition_of(report).endswith("processed")
        assert sent["Message-ID"].encode() in report  # Original-Message-ID: the message it answers


async def test_an_mdn_to_a_receiver_down_for_good_is_dead_and_can_be_replayed(
    as2_env_factory, tmp_path, as2_pki, receiver_factory, capsys
):
    receiver = receiver_factory(failures=None)
    data = mdn_data(tmp_path, as2_pki, receiver.url, max_attempts=2)
    config = tmp_path / "b2bgw-cli.yaml"
    config.write_text(yaml.safe_dump(json.loads(json.dumps(data))))
    async for env in as2_env_factory(data):
        sent = await post_with_async_url(env, as2_pki, receiver.url)
        record = await settled(env, sent["Message-ID"])
        row = await delivery_of(env, record, "dead")
        assert [(a.outcome, a.status) for a in row.timeline] == [("retry", 500), ("retry", 500)]
        endpoint = env.assembly.partners.partners["globex"].delivery.endpoints[MDN_ENDPOINT]
        assert [m.jms_message_id for m in env.messages(endpoint.dead_queue)] == [row.message_id]
        capsys.readouterr()
        assert await asyncio.to_thread(cli.main, ["deliveries", "--config", str(config)]) == 0
        assert ["globex/as2-mdn", "0", "0", "-", "1"] in [line.split() for line in capsys.readouterr().out.splitlines()]

        receiver.failures = 2  # the partner is back
        replay = ["deliveries", "replay", "--config", str(config), "--partner", "globex", "--endpoint", MDN_ENDPOINT]
        assert await asyncio.to_thread(cli.main, [*replay, row.message_id]) == 0
        row = await delivery_of(env, record, "delivered")
        assert [(a.attempt, a.outcome, a.status) for a in row.timeline] == [
            (1, "retry", 500),
            (2, "retry", 500),
            (1, "delivered", 200),  # the replay counts its attempts afresh
        ]
        assert env.depth(endpoint.dead_queue) == 0
        bodies = {body for _, body in receiver.received}
        assert len(receiver.received) == 3 and bodies == {record.mdn.partition(b"\r\n\r\n")[2]}


def _agreement(*urls: str) -> PartnerAgreement:
    return PartnerAgreement("globex", "GLOBEX-AS2", (), None, async_mdn_urls=urls)  # type: ignore[arg-type]


def test_every_partner_with_async_mdn_urls_has_an_as2_mdn_endpoint():
    entry = load_yaml(text="name: Globex\n", name="partners.yaml")
    delivery = with_mdn_endpoint(
        "globex", parse_partner_delivery(entry, "globex"), _agreement("https://g.example/"), entry
    )
    endpoint = delivery.endpoints[MDN_ENDPOINT]
    assert (endpoint.kind, endpoint.queue, endpoint.max_attempts) == ("as2-mdn", "b2b.delivery.globex.as2-mdn", 12)
    assert endpoint.transport.agreement.async_mdn_urls == ("https://g.example/",)
    none = with_mdn_endpoint("globex", parse_partner_delivery(entry, "globex"), _agreement(), entry)
    assert MDN_ENDPOINT not in none.endpoints


@pytest.mark.parametrize(
    "endpoints, urls, message",
    [
        ("  as2-mdn: {kind: as2-mdn, max_attempts: 3}", (), "none are configured"),
        ("  mdns: {kind: as2-mdn}", ("https://g.example/",), "only one of that kind"),
        ("  as2-mdn: {url: 'https://x.example/hook', secrets: [SECRET]}", ("https://g.example/",), "kind 'as2-mdn'"),
        ("  as2-mdn: {kind: as2-mdn, url: 'https://x.example/'}", ("https://g.example/",), "unknown key 'url'"),
    ],
)
def test_as2_mdn_endpoint_mistakes_are_refused_with_their_line(endpoints, urls, message):
    text = "name: Globex\nendpoints:\n" + endpoints.replace("SECRET", SECRET) + "\n"
    entry = load_yaml(text=text, name="partners.yaml")
    with pytest.raises(ConfigError) as caught:
        with_mdn_endpoint("globex", parse_partner_delivery(entry, "globex"), _agreement(*urls), entry)
    assert message in caught.value.detail
    assert caught.value.file == "partners.yaml" and caught.value.line == 3


def test_an_as2_mdn_endpoint_sets_the_engine_keys():
    text = "endpoints:\n  as2-mdn: {kind: as2-mdn, max_attempts: 4, backoff: {initial: 2s, max: 1m}}\n"
    entry = load_yaml(text=text)
    delivery = with_mdn_endpoint(
        "globex", parse_partner_delivery(entry, "globex"), _agreement("https://g.example/"), entry
    )
    endpoint = delivery.endpoints[MDN_ENDPOINT]
    assert (endpoint.max_attempts, endpoint.backoff.initial, endpoint.backoff.maximum) == (4, 2.0, 60.0)
    assert endpoint.transport.agreement is not None


def test_documents_are_never_sent_to_the_as2_mdn_endpoint():
    """A route or handler naming only the partner still gets its one endpoint; naming as2-mdn is refused, while
    an operator's replay finds it by name."""
    text = f"endpoints:\n  main: {{url: 'https://x.example/hook', secrets: [{SECRET}]}}\n"
    entry = load_yaml(text=text)
    delivery = with_mdn_endpoint(
        "globex", parse_partner_delivery(entry, "globex"), _agreement("https://g.example/"), entry
    )
    partners = SimpleNamespace(get={"globex": SimpleNamespace(delivery=delivery)}.get)
    assert endpoint_of(partners, "globex", None, documents=True).name == "main"
    assert endpoint_of(partners, "globex", None).name == "main"
    with pytest.raises(UnknownEndpointError, match="no endpoint 'as2-mdn'"):
        endpoint_of(partners, "globex", MDN_ENDPOINT, documents=True)
    assert endpoint_of(partners, "globex", MDN_ENDPOINT).implicit
