"""Every answer carrying a stored document or reply says: download it, do not sniff, run nothing."""

from __future__ import annotations

import httpx
import pytest
from admin.test_console_browser import served  # noqa: F401 - fixture
from gwtest import ACME, GLOBEX, ORDER
from sectest import planted_invoice


def _assert_never_run(response: httpx.Response) -> None:
    assert response.headers["content-disposition"].startswith("attachment")
    assert response.headers["x-content-type-options"] == "nosniff"
    policy = [p.strip() for p in response.headers["content-security-policy"].split(";")]
    assert "default-src 'none'" in policy and "sandbox" in policy


def test_admin_api_download_of_a_planted_document(served):  # noqa: F811
    r = httpx.post(served.base + "/v1/documents", content=planted_invoice("INV-PLANT-HTTP"), headers=GLOBEX, timeout=30)
    assert r.status_code == 202, r.text
    mid = r.headers["x-message-id"]
    got = httpx.get(f"{served.base}/admin/api/v1/documents/{mid}/request", auth=("alice", "alice-secret-1"), timeout=30)
    assert got.status_code == 200
    assert b"<h:script>" in got.content  # kept as received...
    _assert_never_run(got)  # ...and never run


@pytest.mark.anyio
async def test_partner_reply_download_is_an_attachment(gw_env):
    response = await gw_env.client.post("/v1/documents", content=ORDER, headers=ACME)
    assert response.status_code == 200, response.text
    raw = await gw_env.client.get(f"/v1/documents/{response.headers['x-message-id']}/reply", headers=ACME)
    assert raw.status_code == 200 and raw.content == response.content
    _assert_never_run(raw)
