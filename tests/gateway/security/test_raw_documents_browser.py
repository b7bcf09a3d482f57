"""A partner's planted script never runs in an operator's browser: Debian's chromium, driven by Playwright,
opens the raw document's URL with an operator's session (skipped with the reason without chromium or
Playwright, unless B2BGW_REQUIRE_BROWSER=1)."""

from __future__ import annotations

import httpx
import pytest
from admin.test_console_browser import browser, log_in, served  # noqa: F401 - fixtures
from gwtest import GLOBEX
from sectest import BEACON, planted_invoice


@pytest.fixture()
def planted(served):  # noqa: F811
    r = httpx.post(served.base + "/v1/documents", content=planted_invoice("INV-PLANTED"), headers=GLOBEX, timeout=30)
    assert r.status_code == 202, r.text  # the schema lets any content into ext:ExtensionContent
    return r.headers["x-message-id"]


def test_opening_a_planted_document_runs_no_script(browser, served, planted):  # noqa: F811
    page = log_in(browser, served, "alice", "alice-secret-1")
    context = page.context
    beacons: list[str] = []
    dialogs: list[str] = []
    context.on("request", lambda request: beacons.append(request.url) if "planted-beacon" in request.url else None)
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    url = f"{served.base}/admin/api/v1/documents/{planted}/request"
    downloads: list = []
    page.on("download", lambda download: downloads.append(download))
    try:
        page.goto(url)
    except Exception as exc:  # Playwright's goto raises "Download is starting" for a download
        assert "Download is starting" in str(exc), exc
    page.wait_for_timeout(1_500)  # time for a script, had one run, to call out
    assert dialogs == []
    assert beacons == [], f"the planted script ran and called {beacons}"
    assert page.title() != "PWNED"
    assert [d.url for d in downloads] == [url]  # offered as a download, never rendered
    assert BEACON.encode() in open(downloads[0].path(), "rb").read()  # the document itself, as received
    context.close()
