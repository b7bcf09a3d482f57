"""Keys issued and revoked from the admin API under ``b2bgw serve --processes 2`` on PostgreSQL: the issued key
accepted on /v1/documents by every process, its revocation refused by every process within 5 s, no restart and
no change of partners.yaml; ``b2bgw partners`` lists the issued key and the revocation."""

from __future__ import annotations

import base64
import time

import httpx
import pytest
import yaml
from gwtest import INVOICE, sample_data, with_id
from trust_helpers import Served, plain

from gateway.cli import main as cli
from gateway.routing.partners import hash_key

ADMIN = {
    "Authorization": "Basic " + base64.b64encode(b"carol:carol-secret-3").decode(),
    "Content-Type": "application/json",
}
API = "/admin/api/v1"


def _status(base: str, key: str) -> int:
    with httpx.Client(timeout=30) as c:  # a new connection each time: the kernel spreads them over the processes
        return c.get(f"{base}/v1/documents/ID:none", headers={"Authorization": f"Bearer {key}"}).status_code


def _until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.postgres
def test_a_revocation_from_the_admin_api_reaches_every_process_within_5_s(tmp_path, postgres_schema, capsys):
    assert cli.main(["db", "upgrade", "--url", postgres_schema]) == 0
    data = plain(sample_data(tmp_path))
    data["store"]["url"] = postgres_schema
    data["server"] = {**data.get("server", {}), "partners_reload": "500ms"}
    data["operators"] = {"carol": {"role": "admin", "hash": hash_key("carol-secret-3", ln=4)}}
    config = tmp_path / "b2bgw.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    server = Served(tmp_path, config, "--processes", "2", "--no-workers", scheme="http", store_url=postgres_schema)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.base, timeout=30) as c:
            r = c.post(f"{API}/partners/globex/keys", json={"id": "globex-2027", "label": "2027"}, headers=ADMIN)
            assert r.status_code == 201, r.text
            key = r.json()["key"]
            assert _until(lambda: all(_status(server.base, key) == 404 for _ in range(10)), 10), (
                "the issued key was not accepted by every process"
            )
            sent = c.post(
                "/v1/documents",
                content=with_id(INVOICE, "INV-ADMIN-KEY"),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/xml"},
            )
            assert sent.status_code == 202, sent.text
            reloads = server.log.read_text(errors="replace").count("partners reloaded from")

            r = c.post(f"{API}/partners/globex/keys/globex-2027/revoke", headers=ADMIN)
            assert r.status_code == 200, r.text
            revoked_at = time.monotonic()
            # no asking in between: failed checks from one address are throttled (429) after a while
            time.sleep(max(0.0, 5.0 - (time.monotonic() - revoked_at)))
            assert [_status(server.base, key) for _ in range(20)] == [401] * 20
            assert c.post(f"{API}/partners/globex/keys", json={"id": "globex-2028"}, headers=ADMIN).status_code == 201
            entries = c.get(f"{API}/audit", headers=ADMIN).json()["entries"]
        assert {"key-issue", "key-revoke"} <= {e["action"] for e in entries}
        log = server.log.read_text(errors="replace")
        assert log.count("partners reloaded from") > reloads  # the other process followed the store
        assert key.split(".", 1)[1] not in log
    finally:
        server.stop()

    capsys.readouterr()
    assert cli.main(["partners", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "globex-2027  revoked on" in out and "by carol" in out
    assert "globex-2028 (admin)" in out and "globex-demo  " in out
