"""Wake-ups between processes sharing one SQLite database on one host.

SQLite has no LISTEN/NOTIFY, so a process learns of messages another
process stored by polling (``poll_interval``, 20 ms by default): a consumer
waiting in process B for what process A sent waited 10 ms on average, and a
request-reply exchange that crossed processes twice, 20. With these
wake-ups, A's writer sends, after each commit that made messages available,
one datagram naming the boxes to every other broker process of the host
(Linux abstract UNIX sockets, named after the instance id that each process
registers in ``b2b_instances``); B's poll thread, which now blocks on its
socket instead of sleeping, wakes the consumers of those boxes at once.

Polling stays as the safety net (a datagram dropped because B's buffer is
full, a process B does not know yet), every 0.5 s instead of every 20 ms
(each look costs CPU, which an idle process should not spend fifty times a
second); without these sockets (not Linux) it stays at 20 ms.
Nothing depends on a datagram arriving. A process announces itself to the others when it starts,
learns the others from the instances table, and forgets a peer whose socket
is gone.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
from collections.abc import Iterable

__all__ = ["LocalWakeups", "supported"]

#: Datagram payloads above this size name no boxes: "look at everything".
_MAX_PAYLOAD = 8192
_EVERYTHING = b"*"
_HELLO = b"+"


def supported() -> bool:
    """Whether this OS has abstract UNIX socket names (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


def _address(instance_id: str) -> bytes:
    return b"\0b2bgw-wake/" + instance_id.encode("utf-8")[:90]


class LocalWakeups:
    """One process's end: a socket to receive on, a socket to send from, the known peers."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._inbox.bind(_address(instance_id))
        except OSError:
            self._inbox.close()
            raise
        self._outbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._outbox.setblocking(False)
        self._lock = threading.Lock()
        self._peers: dict[str, bytes] = {}
        #: datagrams sent and received (for tests and statistics)
        self.sent = 0
        self.received = 0

    # ------------------------------------------------------------------ peers

    def set_peers(self, instance_ids: Iterable[str]) -> None:
        """The other broker processes of this host, as the instances table lists them."""
        peers = {i: _address(i) for i in instance_ids if i != self.instance_id}
        with self._lock:
            self._peers = peers

    def announce(self) -> None:
        """Tell the known peers that this process is there (they add it at once)."""
        self._send_all(_HELLO + self.instance_id.encode("utf-8"))

    @property
    def peers(self) -> list[str]:
        with self._lock:
            return list(self._peers)

    # ------------------------------------------------------------------ sending

    def boxes_available(self, boxes: Iterable[str]) -> None:
        """After a commit: wake the peers' consumers of *boxes* (never blocks, never raises)."""
        if not self._peers:
            return
        payload = "\n".join(boxes).encode("utf-8")
        if not payload:
            return
        if len(payload) > _MAX_PAYLOAD:
            payload = _EVERYTHING
        self._send_all(payload)

    def _send_all(self, payload: bytes) -> None:
        with self._lock:
            peers = list(self._peers.items())
        gone = []
        for instance_id, address in peers:
            try:
                self._outbox.sendto(payload, address)
                self.sent += 1
            except OSError as exc:
                # ECONNREFUSED/ENOENT: the peer is gone; EAGAIN: its inbox is full (it is busy and polls anyway)
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    gone.append(instance_id)
        if gone:
            with self._lock:
                for instance_id in gone:
                    self._peers.pop(instance_id, None)

    # ------------------------------------------------------------------ receiving

    def receive(self, timeout: float) -> set[str]:
        """Wait up to *timeout* seconds for datagrams; the boxes they name ("*": all), after draining
        every datagram already queued. Hellos add their sender to the peers."""
        boxes: set[str] = set()
        sock = self._inbox
        sock.settimeout(max(timeout, 0.0))
        try:
            data = sock.recv(65536)
        except (TimeoutError, BlockingIOError):
            return boxes
        except OSError:  # closed while waiting
            return boxes
        sock.setblocking(False)
        while True:
            self.received += 1
            if data.startswith(_HELLO):
                instance_id = data[1:].decode("utf-8", "replace")
                with self._lock:
                    self._peers[instance_id] = _address(instance_id)
            elif data == _EVERYTHING:
                boxes.add("*")
            else:
                boxes.update(data.decode("utf-8", "replace").split("\n"))
            try:
                data = sock.recv(65536)
            except (BlockingIOError, OSError):
                return boxes

    def close(self) -> None:
        self._inbox.close()
        self._outbox.close()
