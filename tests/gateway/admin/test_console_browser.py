"""The console in a real browser: Debian's chromium driven by Playwright, against a gateway served by
uvicorn on a loopback port.

The screenshots of docs/operations-console.md are taken here, at the moments the tests reach the pages they
show, into docs/img/console-*.png: every run with a browser brings them up to date with the console.

Skipped, with the reason, where chromium or Playwright is not installed, unless B2BGW_REQUIRE_BROWSER=1
(.ci/run sets it), which makes their absence a failure. Nothing is downloaded: Playwright launches
/usr/bin/chromium (never `playwright install`).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from gwtest import GLOBEX, INVOICE, SAMPLE_CONFIG, sample_data, with_id

from broker_core import Queue
from gateway.config.loader import settings_from_mapping
from gateway.exchange.assemble import assemble
from gateway.http.app import create_app
from gateway.routing.partners import hash_key
from gateway.runtime.serving import Runtime

CHROMIUM = os.environ.get("B2BGW_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REQUIRE_BROWSER = os.environ.get("B2BGW_REQUIRE_BROWSER") == "1"
#: where the documentation's console screenshots go (docs/operations-console.md shows them)
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def screenshot(page, name: str) -> None:
    """Save the page as docs/img/console-NAME.png for the documentation, and check it was written."""
    SCREENSHOTS.mkdir(exist_ok=True)
    target = SCREENSHOTS / f"console-{name}.png"
    page.screenshot(path=str(target), full_page=False)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def browser_missing() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        return "Playwright for Python is not installed (pip install -e '.[test]')"
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        return f"no chromium at {CHROMIUM} (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = browser_missing()
    if reason is not None:
        if REQUIRE_BROWSER:
            pytest.fail(f"B2BGW_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Served:
    def __init__(self, base: str, runtime: Runtime) -> None:
        self.base = base
        self.runtime = runtime

    @property
    def broker(self):
        return self.runtime.broker

    def post_invoice(self, doc_id: str) -> str:
        r = httpx.post(self.base + "/v1/documents", content=with_id(INVOICE, doc_id), headers=GLOBEX, timeout=30)
        assert r.status_code == 202, r.text
        return r.headers["x-message-id"]


@pytest.fixture(scope="module")
def served(gw_registry, tmp_path_factory):
    import uvicorn

    tmp = tmp_path_factory.mktemp("console")
    data = sample_data(
        tmp,
        operators={
            "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
            "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
        },
        admin={"stats_interval": "200ms"},
    )
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp)
    assembly = assemble(settings, registry=gw_registry)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield Served(f"http://127.0.0.1:{port}", runtime)
    finally:
        server.should_exit = True
        thread.join(30)
        runtime.stop()


def log_in(browser, served: Served, name: str, secret: str):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(served.base + "/console")
    expect(page).to_have_url(re.compile(r"/console/login"))  # a session is needed first
    page.fill("input[name=name]", name)
    page.fill("input[name=secret]", secret)
    page.click("button[type=submit]")
    expect(page.locator("header.top .who")).to_contain_text(name)
    return page


def depth_cell(page, name: str):
    return page.locator(f'#destinations tr[data-destination="{name}"] td.depth')


def test_log_in_and_see_a_queue_fill_up_then_browse_it_and_open_a_message(browser, served):
    from playwright.sync_api import expect

    served.broker.purge("queue://invoices.inbound")
    page = log_in(browser, served, "alice", "alice-secret-1")
    expect(depth_cell(page, "queue://invoices.inbound")).to_have_text("0")
    ids = [served.post_invoice(f"INV-B{i}") for i in range(3)]
    expect(depth_cell(page, "queue://invoices.inbound")).to_have_text("3")  # the overview refreshes itself
    screenshot(page, "overview")
    page.click('#destinations a:text-is("queue://invoices.inbound")')
    expect(page.locator("h1")).to_contain_text("queue://invoices.inbound")
    rows = page.locator("#messages a.message-link")
    expect(rows).to_have_count(3)
    assert rows.all_inner_texts() == ids
    page.fill("input[name=selector]", "InvoiceID = 'INV-B1'")
    page.click("button:text-is('Browse')")
    expect(rows).to_have_count(1)
    screenshot(page, "browse")
    rows.first.click()
    expect(page.locator("h1")).to_have_text(ids[1])
    expect(page.locator("#body")).to_contain_text("<cbc:ID>INV-B1</cbc:ID>")
    screenshot(page, "message")
    expect(page.locator("#size")).to_contain_text(f"({len(with_id(INVOICE, 'INV-B1'))} bytes)")
    page.context.close()


def test_replay_a_dead_letter_and_see_it_leave_the_dead_letter_queue(browser, served):
    from playwright.sync_api import expect

    served.broker.purge("queue://invoices.inbound")
    served.broker.purge("queue://DLQ.invoices.inbound")
    mid = served.post_invoice("INV-DEAD")
    conn = served.broker.connect()
    conn.start()
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(Queue("invoices.inbound"))
    for _ in range(2):  # max_deliveries 2: then it is a dead letter
        assert consumer.receive(timeout=5) is not None
        session.rollback()
    conn.close()
    page = log_in(browser, served, "alice", "alice-secret-1")
    page.click("nav a:text-is('Dead letters')")
    page.click('#dead-letter-queues a:text-is("queue://DLQ.invoices.inbound")')
    rows = page.locator("#messages a.message-link")
    expect(rows).to_have_text([mid])
    screenshot(page, "dead-letters")
    page.check(f'input[name=message_id][value="{mid}"]')
    page.click("#replay")
    expect(page.locator(".flash")).to_contain_text("Replayed 1 message")
    expect(rows).to_have_count(0)
    assert served.broker.find_message("queue://invoices.inbound", mid) is not None
    page.click("nav a:text-is('Audit')")
    first = page.locator("#audit tbody tr").first
    expect(first).to_contain_text("replay")
    expect(first).to_contain_text("alice")
    page.context.close()


def test_search_the_ledger_by_document_id_and_open_its_timeline(browser, served):
    from playwright.sync_api import expect

    mid = served.post_invoice("INV-FIND-ME")
    page = log_in(browser, served, "alice", "alice-secret-1")
    page.click("nav a:text-is('Ledger')")
    page.fill("input[name=doc_id]", "INV-FIND-ME")
    page.click("button:text-is('Search')")
    links = page.locator("#documents a.doc-link")
    expect(links).to_have_text(["INV-FIND-ME"])
    links.first.click()
    expect(page.locator("h1")).to_contain_text("Invoice INV-FIND-ME")
    timeline = page.locator("#timeline li strong")
    expect(timeline.first).to_have_text("received")
    expect(page.locator("#timeline")).to_contain_text("accepted")
    expect(page.locator("#request")).to_contain_text("<cbc:ID>INV-FIND-ME</cbc:ID>")
    screenshot(page, "document")
    assert mid in page.content()
    page.context.close()


def test_a_viewer_is_refused_an_action(browser, served):
    from playwright.sync_api import expect

    mid = served.post_invoice("INV-VIEWER")
    page = log_in(browser, served, "bob", "bob-secret-22")
    page.goto(served.base + "/console/destination?name=queue%3A%2F%2Finvoices.inbound")
    expect(page.locator("#viewer-note")).to_be_visible()
    delete = page.locator("button[value=delete]").first
    expect(delete).to_be_disabled()
    # the page offers nothing; a viewer who forces the form anyway is refused by the server
    page.check(f'input[name=message_id][value="{mid}"]')
    page.evaluate("document.querySelectorAll('button[disabled]').forEach(b => b.disabled = false)")
    page.on("dialog", lambda dialog: dialog.accept())
    delete.click()
    expect(page.locator(".flash.error")).to_contain_text("bob is a viewer")
    assert served.broker.find_message("queue://invoices.inbound", mid) is not None
    page.context.close()


def test_the_console_reads_on_a_phone(browser, served):
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(served.base + "/console/login")
    page.fill("input[name=name]", "alice")
    page.fill("input[name=secret]", "alice-secret-1")
    page.click("button[type=submit]")
    expect(page.locator("#destinations")).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 + 1  # nothing pushes the page sideways: wide tables scroll inside their box
    context.close()
