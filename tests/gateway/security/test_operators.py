"""The operators' side against guessing and forging, on a real server: the lockout is keyed on name and
address, with backoff, shared through the store by every process; every failed login is audited under a
truncated name marked unverified; reads of documents and messages are audited."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from gwtest import GLOBEX, INVOICE, REPO, with_id
from sectest import RealServer

from gateway.http.app import create_app
from gateway.routing.partners import hash_key
from gateway.runtime.serving import Runtime
from gateway.security.lockout import FIRST_LOCK, Lockout

API = "/admin/api/v1"
OPERATORS = {
    "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
    "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
}


class Admin:
    def __init__(self, server: RealServer, runtime: Runtime) -> None:
        self.server = server
        self.runtime = runtime

    def client(self, address: str) -> httpx.Client:
        """A client whose requests come from *address* (any 127.x.y.z is this machine)."""
        return httpx.Client(base_url=self.server.base, timeout=60, transport=httpx.HTTPTransport(local_address=address))

    def audit(self, **query: str) -> list[dict]:
        with self.client("127.0.0.1") as c:
            r = c.get(f"{API}/audit", params={"limit": "100", **query}, auth=("bob", "bob-secret-22"))
        assert r.status_code == 200
        return r.json()["entries"]


@pytest.fixture()
def admin(make_assembly) -> Iterator[Admin]:
    assembly = make_assembly(operators=OPERATORS, admin={"login_attempts": 3, "login_window": "1m"})
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        with RealServer(create_app(assembly, runtime=runtime)) as server:
            yield Admin(server, runtime)
    finally:
        runtime.stop()


def _login(client: httpx.Client, name: str, secret: str) -> httpx.Response:
    return client.post(f"{API}/session", json={"name": name, "secret": secret})


def test_guesses_from_one_address_do_not_lock_the_operator_out_elsewhere(admin):
    with admin.client("127.0.0.2") as attacker, admin.client("127.0.0.3") as alice:
        for _ in range(3):
            assert _login(attacker, "alice", "guess").status_code == 401
        r = _login(attacker, "alice", "alice-secret-1")  # locked for this address, right secret or not
        assert r.status_code == 429 and r.json()["code"] == "too-many-login-attempts"
        assert 1 <= int(r.headers["retry-after"]) <= FIRST_LOCK + 1
        assert attacker.get(f"{API}/destinations", auth=("alice", "alice-secret-1")).status_code == 429  # Basic too
        assert _login(alice, "alice", "alice-secret-1").status_code == 200  # the operator, from elsewhere


def test_the_lock_doubles_with_each_further_failure_up_to_the_window(admin):
    lockout = Lockout(admin.runtime.broker.engine, admin.runtime.broker.write, attempts=3, window=60)
    locks = [lockout.fail("carol", "192.0.2.1") for _ in range(8)]
    assert locks == [0, 0, 5, 10, 20, 40, 60, 60]
    assert 55 <= lockout.retry_after("carol", "192.0.2.1") <= 60
    assert lockout.retry_after("carol", "192.0.2.2") == 0 and lockout.retry_after("dave", "192.0.2.1") == 0
    lockout.clear("carol", "192.0.2.1")
    assert lockout.retry_after("carol", "192.0.2.1") == 0


def test_failures_counted_by_another_process_lock_this_one(admin):
    url = admin.runtime.broker.engine.url.render_as_string(hide_password=False)
    code = (
        "import sys\n"
        "from broker_core import Broker\n"
        "from gateway.security.lockout import Lockout\n"
        "b = Broker.open(sys.argv[1])\n"
        "lockout = Lockout(b.engine, b.write, attempts=3, window=60)\n"
        "print([lockout.fail('alice', '127.0.0.4') for _ in range(3)])\n"
        "b.close()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code, url], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    with admin.client("127.0.0.4") as locked, admin.client("127.0.0.5") as other:
        assert _login(locked, "alice", "alice-secret-1").status_code == 429
        assert _login(other, "alice", "alice-secret-1").status_code == 200


def test_every_kind_of_failed_login_is_audited_unverified_and_truncated(admin):
    forged = "alice\r\n" + "x" * 5000
    with admin.client("127.0.0.6") as c:
        assert _login(c, forged, "guess").status_code == 401  # JSON session login
        assert c.get(f"{API}/destinations", auth=("mallory", "guess")).status_code == 401  # HTTP Basic
        form = c.get("/console/login")
        token = form.cookies["b2bgw_login"]
        r = c.post("/console/login", data={"name": "eve", "secret": "guess", "csrf": token, "next": "/console"})
        assert r.status_code == 303  # back to the form
    refused = [e for e in admin.audit(action="login") if e["outcome"] == "refused"]
    by_detail = {e["detail"].split(";")[0]: e for e in refused}
    assert set(by_detail) >= {"failed json login", "failed basic login", "failed form login"}
    for entry in refused:
        assert entry["role"] == "unverified" and entry["client"] == "127.0.0.6"
        assert len(entry["operator"]) <= 40 and "\n" not in entry["operator"] and "\r" not in entry["operator"]
    assert by_detail["failed json login"]["operator"].startswith("alice\\r\\nxxx")
    assert by_detail["failed basic login"]["operator"] == "mallory"


def test_reads_of_documents_and_messages_are_audited(admin):
    with admin.client("127.0.0.7") as c:
        r = c.post("/v1/documents", content=with_id(INVOICE, "READ-ME"), headers=GLOBEX)
        assert r.status_code == 202
        mid = r.headers["x-message-id"]
        assert c.get(f"{API}/documents/{mid}", auth=("bob", "bob-secret-22")).status_code == 200
        assert c.get(f"{API}/documents/{mid}/request", auth=("bob", "bob-secret-22")).status_code == 200
        r = c.get(
            f"{API}/message",
            params={"destination": "queue://invoices.inbound", "id": mid},
            auth=("bob", "bob-secret-22"),
        )
        assert r.status_code == 200
    reads = admin.audit(operator="bob")
    documents = [e for e in reads if e["action"] == "read-document"]
    assert [e["target"] for e in documents] == [mid, mid]
    assert any("downloaded" in e["detail"] for e in documents)
    [message] = [e for e in reads if e["action"] == "read-message"]
    assert message["message_ids"] == [mid] and message["client"] == "127.0.0.7" and message["role"] == "viewer"
