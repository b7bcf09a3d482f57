"""The STOMP flood of ``bench/hostile_bench.py --stomp-flood``: every kind at once, against the listener
``b2bgw serve`` runs beside the HTTP gateway, from a process of its own.

* connections that never send CONNECT (50 at a time, again as soon as they are dropped);
* a megabyte before CONNECT (a CONNECT announcing a 100 MB body);
* CONNECTs with wrong passcodes for the sample's back-end login;
* an authenticated user (send right on ``/queue/flood.>``) sending 20 KB non-persistent messages to a
  queue nobody reads, as fast as the socket takes them, from two connections;
* the same user piling 20 KB messages into a transaction it never commits.

Each flooder reconnects as soon as the listener drops it; the ERROR frames it got are counted by their
``message`` header.
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
import uuid

FLOODER = "flooder"


def _answer(sock: socket.socket, timeout: float = 5) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, OSError):
        pass
    return data


def _connect(port: int, login: str, passcode: str) -> socket.socket | None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(f"CONNECT\naccept-version:1.2\nhost:x\nlogin:{login}\npasscode:{passcode}\n\n\x00".encode())
        reply = b""
        while b"\x00" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                return None
            reply += chunk
    except OSError:
        return None
    if not reply.startswith(b"CONNECTED"):
        sock.close()
        return None
    return sock


class Flood:
    def __init__(self, port: int, passcode: str) -> None:
        self.port = port
        self.passcode = passcode
        self.stop = threading.Event()
        self.errors: dict[str, int] = {}
        self.sent_bytes = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=fn, daemon=True)
            for fn in (self._silent, self._oversized, self._guessing, self._sender, self._sender, self._transaction)
        ]

    def _saw(self, data: bytes) -> None:
        for line in data.split(b"\n"):
            if line.startswith(b"message:"):
                key = line[8:].decode(errors="replace")
                with self.lock:
                    self.errors[key] = self.errors.get(key, 0) + 1

    def _silent(self) -> None:
        while not self.stop.is_set():
            socks = []
            for _ in range(50):
                try:
                    socks.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
                except OSError:
                    break
            for sock in socks:
                self._saw(_answer(sock, 15))
                sock.close()

    def _oversized(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    try:
                        sock.sendall(b"CONNECT\naccept-version:1.2\ncontent-length:100000000\n\n" + b"x" * 1_000_000)
                    except OSError:
                        pass
                    self._saw(_answer(sock))
            except OSError:
                time.sleep(0.1)

    def _guessing(self) -> None:
        while not self.stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                    sock.sendall(
                        f"CONNECT\naccept-version:1.2\nlogin:backend\npasscode:{uuid.uuid4().hex}\n\n\x00".encode()
                    )
                    self._saw(_answer(sock))
            except OSError:
                time.sleep(0.1)

    def _flood(self, first: bytes, frame: bytes) -> None:
        while not self.stop.is_set():
            sock = _connect(self.port, FLOODER, self.passcode)
            if sock is None:
                time.sleep(0.1)
                continue
            try:
                sock.sendall(first)
                while not self.stop.is_set():
                    sock.sendall(frame)
                    with self.lock:
                        self.sent_bytes += len(frame)
            except OSError:
                pass
            self._saw(_answer(sock))
            sock.close()

    def _sender(self) -> None:
        frame = b"SEND\ndestination:/queue/flood.np\ncontent-length:20000\n\n" + b"f" * 20000 + b"\x00"
        self._flood(b"", frame * 10)

    def _transaction(self) -> None:
        frame = b"SEND\ndestination:/queue/flood.tx\ntransaction:t\ncontent-length:20000\n\n" + b"t" * 20000 + b"\x00"
        self._flood(b"BEGIN\ntransaction:t\n\n\x00", frame * 10)

    def run(self, seconds: float) -> dict[str, object]:
        for thread in self.threads:
            thread.start()
        time.sleep(seconds)
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        return {"errors": dict(self.errors), "sent_mb": self.sent_bytes / 1e6}


def flood_process(port: int, passcode: str, seconds: float, out: multiprocessing.Queue) -> None:
    out.put({"stomp": Flood(port, passcode).run(seconds)})
