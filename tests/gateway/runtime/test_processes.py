"""``b2bgw serve --processes N`` (gateway.runtime.processes): one port, one store, several serving processes.

The server runs for real (a supervisor and two serving processes, a temporary SQLite store) and is
driven over HTTP; what must hold is what a partner and an operator expect of one gateway: every
document accepted once, replays answered from the first acceptance whichever process takes them,
request-reply answered, a crashed process replaced without losing what was accepted, a clean stop.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gwtest import ACME, GLOBEX, REPO, SAMPLE_CONFIG, UBL_EXAMPLES

from gateway.config.loader import settings_from_mapping
from gateway.errors import ConfigError
from gateway.runtime.processes import Supervisor, process_count, usable_cpus

INVOICE = (UBL_EXAMPLES / "UBL-Invoice-2.1-Example.xml").read_bytes()
ORDER = (UBL_EXAMPLES / "UBL-Order-2.1-Example.xml").read_bytes()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return sorted(out)


def _wait_ready(base: str, proc: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not become ready")


def _serve(tmp_path: Path, *extra: str, config: Path = SAMPLE_CONFIG) -> tuple[subprocess.Popen, str, Path]:
    port = _free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "B2BGW_STORE_URL": f"sqlite:///{tmp_path / 'gw.db'}", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "--log-level",
            "INFO",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--no-etl",
            "--no-stomp",
            "--no-access-log",
            *extra,
        ],
        cwd=str(tmp_path),
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return proc, f"http://127.0.0.1:{port}", log


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the supervisor did not stop within 40 s of SIGTERM") from None
    return proc.returncode


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("processes")
    proc, base, log = _serve(tmp, "--processes", "2")
    try:
        _wait_ready(base, proc)
        yield proc, base, log
    finally:
        _stop(proc)


def _post(base: str, body: bytes, headers: dict[str, str], **kw) -> httpx.Response:
    # a new connection each time: the kernel spreads connections over the serving processes
    with httpx.Client(timeout=30) as client:
        return client.post(f"{base}/v1/documents", content=body, headers=headers, **kw)


def test_two_serving_processes_each_on_its_own_cpu(two):
    proc, _, _ = two
    children = _children(proc.pid)
    assert len(children) == 2
    if len(usable_cpus()) >= 2:
        assert sorted(next(iter(os.sched_getaffinity(pid))) for pid in children) == usable_cpus()[:2]
        assert all(len(os.sched_getaffinity(pid)) == 1 for pid in children)


def _sockets_on_port(pid: int, port: int) -> dict[str, int]:
    """How many TCP sockets of process *pid* have *port* as their local port, by state (LISTEN, ESTABLISHED)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    counts = {"LISTEN": 0, "ESTABLISHED": 0}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            state = {"0A": "LISTEN", "01": "ESTABLISHED"}.get(fields[3])
            if local_port == port and state and fields[9] in inodes:
                counts[state] += 1
    return counts


def test_each_process_listens_on_its_own_socket_and_new_connections_are_spread(two):
    proc, base, _ = two
    port = int(base.rsplit(":", 1)[1])
    children = _children(proc.pid)
    # one listening socket per serving process, none left in the supervisor (so a dead process's socket
    # leaves the port's group with it, and new connections go to the live ones)
    assert [_sockets_on_port(pid, port)["LISTEN"] for pid in children] == [1, 1]
    assert _sockets_on_port(proc.pid, port)["LISTEN"] == 0
    # a burst of new keep-alive connections, as a load generator opens them: both processes get a share
    # (one shared socket let the first event loop to wake accept the whole burst)
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(24)]
    try:
        for conn in conns:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
        for conn in conns:
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
        served = [_sockets_on_port(pid, port)["ESTABLISHED"] for pid in children]
        assert sum(served) == 24
        assert min(served) >= 4, f"connections per process: {served}"
    finally:
        for conn in conns:
            conn.close()


def test_documents_accepted_once_and_replays_answered_by_either_process(two):
    _, base, _ = two
    first = _post(base, INVOICE, GLOBEX)
    assert first.status_code == 202, first.text
    receipt = first.json()
    # the same document again, over fresh connections: whichever process takes it answers the first receipt
    for _ in range(12):
        again = _post(base, INVOICE, GLOBEX)
        assert again.status_code == 202
        assert again.json()["message_id"] == receipt["message_id"]
    status = httpx.get(f"{base}{receipt['status_url']}", headers=GLOBEX, timeout=10)
    assert status.status_code == 200 and status.json()["message_id"] == receipt["message_id"]


def test_request_reply_through_the_sample_responder(two):
    _, base, _ = two
    for i in range(8):
        body = ORDER.replace(b"<cbc:ID>34</cbc:ID>", f"<cbc:ID>mp-{i}</cbc:ID>".encode(), 1)
        reply = _post(base, body, {**ACME, "X-Correlation-ID": f"corr-mp-{i}"})
        assert reply.status_code == 200, reply.text
        assert b"OrderResponse" in reply.content
        assert reply.headers["x-correlation-id"] == f"corr-mp-{i}"


def test_a_killed_process_is_replaced_and_nothing_accepted_is_lost(two, tmp_path):
    proc, base, _ = two
    accepted = []
    for i in range(10):
        body = INVOICE.replace(b"<cbc:ID>TOSL108</cbc:ID>", f"<cbc:ID>kill-{i}</cbc:ID>".encode(), 1)
        r = _post(base, body, GLOBEX)
        assert r.status_code == 202, r.text
        accepted.append(r.json())
    victim = _children(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    # the other process keeps serving meanwhile
    body = INVOICE.replace(b"<cbc:ID>TOSL108</cbc:ID>", b"<cbc:ID>during-restart</cbc:ID>", 1)
    during = _post(base, body, GLOBEX)
    assert during.status_code == 202, during.text
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        children = _children(proc.pid)
        if len(children) == 2 and victim not in children:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the killed process was not replaced: {_children(proc.pid)}")
    _wait_ready(base, proc)
    for receipt in [*accepted, during.json()]:
        status = httpx.get(f"{base}{receipt['status_url']}", headers=GLOBEX, timeout=10)
        assert status.status_code == 200, status.text
        assert status.json()["message_id"] == receipt["message_id"]


def test_sigterm_stops_every_process(tmp_path):
    proc, base, _ = _serve(tmp_path, "--processes", "2", "--no-workers")
    _wait_ready(base, proc)
    children = _children(proc.pid)
    assert len(children) == 2
    assert _stop(proc) == 0
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_a_process_failing_at_start_up_stops_the_supervisor(tmp_path):
    # a route naming a schema that is not configured: found when each serving process assembles its routes
    # (the supervisor itself checks the address, the worker modules and the store before it starts them)
    routes = tmp_path / "routes.yaml"
    routes.write_text(
        (REPO / "routes" / "ubl-2.1.yaml")
        .read_text()
        .replace("schema: ubl-2.1/Order\n", "schema: ubl-2.1/no_such_schema_for_this_test\n", 1)
    )
    config = tmp_path / "b2bgw.yaml"
    config.write_text(
        SAMPLE_CONFIG.read_text()
        .replace("partners: partners.yaml", f"partners: {REPO}/config/partners.yaml")
        .replace("routes: ../routes/ubl-2.1.yaml", f"routes: {routes}")
        .replace("file: ../rules/", f"file: {REPO}/rules/")
    )
    proc, _, log = _serve(tmp_path, "--processes", "2", config=config)
    try:
        code = proc.wait(90)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise AssertionError("the supervisor kept running after its processes failed at start-up") from None
    assert code != 0
    text = log.read_text()
    assert "no_such_schema_for_this_test" in text and "during start-up" in text


# --------------------------------------------------------------------------- configuration


def test_processes_setting_and_its_errors():
    s = settings_from_mapping({"server": {"processes": 3, "pin_processes": False}})
    assert s.processes == 3 and s.pin_processes is False
    assert process_count(s) == 3 and process_count(s, 2) == 2
    assert process_count(settings_from_mapping({"server": {"processes": 0}})) == len(usable_cpus())
    assert process_count(settings_from_mapping({})) == 1
    with pytest.raises(ConfigError, match="server.processes"):
        settings_from_mapping({"server": {"processes": -1}})
    with pytest.raises(ConfigError, match="pin_processes"):
        settings_from_mapping({"server": {"pin_processes": "sometimes"}})


def test_several_processes_need_a_sql_store():
    s = settings_from_mapping({"store": {"url": "memory://"}})
    with pytest.raises(ConfigError, match="needs a SQL store"):
        Supervisor(s, 2, host="127.0.0.1", port=0, child_args=[])


def test_a_taken_port_is_a_clear_error(tmp_path):
    s = settings_from_mapping({"store": {"url": f"sqlite:///{tmp_path / 'x.db'}"}})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        supervisor = Supervisor(s, 2, host="127.0.0.1", port=taken.getsockname()[1], child_args=[])
        with pytest.raises(ConfigError, match="cannot listen on 127.0.0.1"):
            supervisor.bind()


def test_a_successors_socket_takes_no_connection_until_its_process_listens(tmp_path):
    """While a replaced process starts up (seconds), new connections go to the live processes: its socket is in
    the port's group only once it listens (uvicorn listens after the app's start-up)."""
    s = settings_from_mapping({"store": {"url": f"sqlite:///{tmp_path / 'x.db'}"}})
    supervisor = Supervisor(s, 2, host="127.0.0.1", port=0, child_args=[])
    port = supervisor.bind()
    live, _ = (child.sock for child in supervisor.children)
    starting = supervisor._listen(listen=False)  # what a successor gets
    try:
        for _ in range(40):  # the kernel spreads connections by a hash of their addresses: many tries
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
        live.settimeout(1)
        taken = 0
        while True:
            try:
                conn, _ = live.accept()
            except TimeoutError:
                break
            conn.close()
            taken += 1
        # the first-started sockets listen: the other one takes its share too, the starting one none
        assert taken > 0
        starting.listen(8)
        starting.settimeout(0.2)
        with pytest.raises(TimeoutError):
            starting.accept()  # nothing queued for it before it listened
    finally:
        starting.close()
        for child in supervisor.children:
            supervisor._unlisten(child)
