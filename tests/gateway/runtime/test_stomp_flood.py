"""A STOMP flood against ``b2bgw serve`` (its listener runs in the serving process, beside the HTTP
gateway): connections that never CONNECT, oversized frames before CONNECT, wrong passcodes, an
authenticated user sending non-persistent messages to a queue nobody reads and piling up a transaction.
The HTTP gateway answers every honest request meanwhile (generous bounds, no timing ratio asserted here:
``bench/hostile_bench.py --stomp-flood`` measures the latencies), the listener refuses what is beyond its
limits with ERROR frames, and the process lives on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
import yaml
from gwtest import ACME, ORDER, REPO, with_id

from broker_core.stomp import hash_passcode

FLOODER = "flooder"
FLOODER_PASSCODE = "flood-" + uuid.uuid4().hex


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stomp-flood")
    config = yaml.safe_load((REPO / "config" / "b2bgw.yaml").read_text())
    config["partners"] = str(REPO / "config" / "partners.yaml")
    config["routes"] = str(REPO / "routes" / "ubl-2.1.yaml")
    for rule_set in config["rules"]["sets"].values():
        rule_set["file"] = str((REPO / "config" / rule_set["file"]).resolve())
    config["store"]["url"] = f"sqlite:///{tmp / 'gw.db'}"
    config["etl"] = {"enabled": False}
    stomp_port = _free_port()
    config["stomp"]["port"] = stomp_port
    config["stomp"]["users"]["backend"]["passcode_file"] = str(tmp / "backend.passcode")
    config["stomp"]["users"][FLOODER] = {"passcode_hash": hash_passcode(FLOODER_PASSCODE), "send": ["/queue/flood.>"]}
    config["stomp"]["limits"] = {
        "memory_bytes": 8 * 1024 * 1024,
        "send_wait": 1,
        "connect_timeout": 2,
        "connections": 200,
    }
    (tmp / "b2bgw.yaml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = tmp / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("B2BGW_STORE_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "serve",
            "--config",
            str(tmp / "b2bgw.yaml"),
            "--port",
            str(port),
            "--no-etl",
            "--no-access-log",
        ],
        cwd=str(tmp),
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        yield base, stomp_port, proc, tmp
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _error_of(sock: socket.socket, timeout: float = 10) -> bytes:
    """What the listener answered before closing (b"" if nothing)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def _connect(port: int, login: str, passcode: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\npasscode:{passcode}\n\n\x00".encode())
    reply = b""
    while b"\x00" not in reply:
        chunk = sock.recv(4096)
        assert chunk, "closed before CONNECTED"
        reply += chunk
    assert reply.startswith(b"CONNECTED"), reply[:200]
    return sock


class Flood:
    """Every kind of flood at once, in threads, until stopped; counts the ERROR frames seen."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stop = threading.Event()
        self.errors: dict[str, int] = {}
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=fn, daemon=True)
            for fn in (self._silent, self._oversized, self._guessing, self._sender, self._sender, self._transaction)
        ]

    def _saw(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line.startswith(b"message:"):
                with self.lock:
                    key = line[8:].decode(errors="replace")
                    self.errors[key] = self.errors.get(key, 0) + 1

    def _silent(self) -> None:  # connections that never CONNECT
        while not self.stop.is_set():
            socks = []
            for _ in range(50):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
                except OSError:
                    break
            for sock in socks:
                self._saw(_error_of(sock, 5))
                sock.close()

    def _oversized(self) -> None:  # megabytes before CONNECT
        while not self.stop.is_set():
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                try:
                    sock.sendall(b"CONNECT\naccept-version:1.2\ncontent-length:100000000\n\n" + b"x" * 1_000_000)
                except OSError:
                    pass
                self._saw(_error_of(sock, 5))

    def _guessing(self) -> None:  # wrong passcodes
        while not self.stop.is_set():
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                sock.sendall(
                    f"CONNECT\naccept-version:1.2\nlogin:backend\npasscode:{uuid.uuid4().hex}\n\n\x00".encode()
                )
                self._saw(_error_of(sock, 5))

    def _sender(self) -> None:  # non-persistent messages to a queue nobody reads, as fast as taken
        frame = b"SEND\ndestination:/queue/flood.np\ncontent-length:20000\n\n" + b"f" * 20000 + b"\x00"
        while not self.stop.is_set():
            sock = _connect(self.port, FLOODER, FLOODER_PASSCODE)
            try:
                while not self.stop.is_set():
                    sock.sendall(frame * 10)
            except OSError:
                pass
            self._saw(_error_of(sock, 5))
            sock.close()

    def _transaction(self) -> None:  # a transaction that is never committed
        frame = b"SEND\ndestination:/queue/flood.tx\ntransaction:t\ncontent-length:20000\n\n" + b"t" * 20000 + b"\x00"
        while not self.stop.is_set():
            sock = _connect(self.port, FLOODER, FLOODER_PASSCODE)
            try:
                sock.sendall(b"BEGIN\ntransaction:t\n\n\x00")
                while not self.stop.is_set():
                    sock.sendall(frame * 10)
            except OSError:
                pass
            self._saw(_error_of(sock, 5))
            sock.close()

    def __enter__(self) -> Flood:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def test_http_keeps_answering_while_stomp_is_flooded(gateway):
    base, stomp_port, proc, tmp = gateway
    answered: list[float] = []
    failures: list[str] = []
    secret = (tmp / "backend.passcode").read_text().strip()  # generated on first run, for the operator to read
    _connect(stomp_port, "backend", secret).close()
    with Flood(stomp_port) as flood, httpx.Client(base_url=base, timeout=30) as client:
        time.sleep(2)  # the flood is running
        for n in range(40):
            started = time.perf_counter()
            try:
                response = client.post(
                    "/v1/documents", content=with_id(ORDER, f"FLOOD-{uuid.uuid4().hex[:8]}-{n}"), headers=ACME
                )
                if response.status_code == 200:
                    answered.append(time.perf_counter() - started)
                else:
                    failures.append(f"{response.status_code} {response.text[:200]}")
            except httpx.HTTPError as exc:
                failures.append(type(exc).__name__)
            health = client.get("/healthz")
            if health.status_code != 200:
                failures.append(f"healthz {health.status_code}")
            time.sleep(0.1)
        seen = dict(flood.errors)
    assert not failures, failures
    assert len(answered) == 40 and max(answered) < 10, max(answered)  # each honest order replied to, in bounds
    assert proc.poll() is None  # the process lives on
    assert seen.get("memory limit reached") and seen.get("connect timeout"), seen
    assert seen.get("authentication failed") or seen.get("authentication throttled"), seen
    assert any(key.startswith("malformed frame") for key in seen), seen
    # the back end, verified before, still logs in from the address the guesses come from
    _connect(stomp_port, "backend", secret).close()
