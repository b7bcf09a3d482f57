"""One STOMP connection: frames in, broker calls, frames out.

Each STOMP connection is one broker :class:`~broker_core.Connection`. Each
SUBSCRIBE is a consumer on its own session (AUTO for ``ack:auto``, else
INDIVIDUAL with STOMP's cumulative ``client`` ACK emulated per
subscription); each BEGIN a transacted session whose sends are staged and
committed, with the transaction's ACKs, in one store transaction at COMMIT.

Access: CONNECT must name a configured user with its passcode
(``_auth``); each SUBSCRIBE and SEND is checked against the user's rights
(``_users``). Temporary destinations belong to the connection that created
them: only it consumes or browses them; another SENDs to one only to reply
to a message it consumed (``_grants``); ``reply-to`` names only this
connection's temporary destinations or destinations the user may send to.
``JMSXUserID`` is the authenticated login, whatever the client says.

Bounds: see ``_limits`` (each has its own ERROR frame).

Store writes: the SENDs that one read of the socket brings (a streaming
producer's) that go through the store are committed together, as one store
write, once the read is handled, or earlier when another kind of frame, a
``receipt`` header or ``SEND_BATCH`` of them come; their order is kept. A
RECEIPT is written only once every store write before it is committed (and,
for a persistent message on a durable store, synced); a SEND's RECEIPT is
written when that happens, while the frames after it are read and handled,
other frames' once it has happened, before the next frame. Receipts go out in
the order they were asked for.

Back-pressure: frames of one connection are handled in order and the socket
is not read while a frame waits, so a producer faster than the store is
slowed by TCP (at most ``MAX_INFLIGHT`` messages and acknowledgements are
pipelined in store writes); a
subscription delivers at most ``prefetch`` unacknowledged messages (client
modes) and waits whenever the socket's send buffer is above its high-water
mark, so a slow consumer does not make the server buffer without limit.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from .._commit import store_commit_async as _store_commit_async
from .._constants import AckMode, DeliveryMode
from .._destinations import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from .._envelope import NON_PERSISTENT
from .._errors import InvalidDestinationError, JMSError
from .._memory import MemoryStore
from .._store import Delivery
from ._auth import AuthenticationError
from ._frames import Frame, FrameError, FrameParser, encode
from ._limits import MESSAGE_OVERHEAD
from ._mapping import encode_message, message_from_send, split_destination
from ._protocol import ProtocolError, error_title
from ._settings import ListenerSettings
from ._subscription import BATCH, StompSubscription

__all__ = ["StompConnection", "ProtocolError"]

log = logging.getLogger(__name__)

VERSIONS = ("1.2", "1.1", "1.0")
MAX_INFLIGHT = 512  # messages and acknowledgements pipelined in store writes per connection before reading pauses
CLAIM_MAX = 1000  # the most messages the store claims for one subscription at once, whatever its prefetch
SEND_BATCH = 64  # SENDs committed together at most
WRITE_HIGH_WATER = 256 * 1024
BUSY_SLICE = 0.005  # seconds a connection with data waiting handles frames before it lets others run
MAX_CLIENT_IDS = 100000  # client ids remembered with their owner
_VERBS = {"send": "send to", "consume": "consume from", "browse": "browse", "reply-to": "name in reply-to"}


class _Transaction:
    __slots__ = ("session", "producer", "acks", "nacks", "count", "held")

    def __init__(self, session: Any) -> None:
        self.session = session
        self.producer = session.create_producer(None)
        self.acks: list[Delivery] = []
        self.nacks: list[Delivery] = []
        self.count = 0  # SENDs, ACKs and NACKs held
        self.held = 0  # bytes counted in the memory budget


class StompConnection:
    """One client: *settings* are its listener's, *on_closed* is called with
    the connection once it is finished."""

    def __init__(
        self,
        settings: ListenerSettings,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_closed: Callable[[StompConnection], None] | None = None,
    ) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.on_closed = on_closed
        self.broker = settings.broker
        self.store = settings.broker.store
        self._sync_store = isinstance(self.store, MemoryStore)
        self.reader = reader
        self.writer = writer
        self.transport = writer.transport
        before = settings.limits.connect_frame_bytes  # small until the client has authenticated
        self.parser = FrameParser(
            "1.2",
            max_frame_size=min(before, settings.max_frame_size),
            max_headers=min(64, settings.max_headers),
            max_header_bytes=min(before, settings.max_header_bytes),
        )
        self.user: Any = None  # the StompUser once CONNECTed
        self.login: str = ""
        self.version: str | None = None
        self.jms: Any = None  # the broker Connection once CONNECTed
        self.session: Any = None  # for non-transacted sends and unsubscribes
        self.producer: Any = None
        self.subs: dict[str, StompSubscription] = {}
        self.acks: dict[str, StompSubscription] = {}
        self.txs: dict[str, _Transaction] = {}
        self.temps: dict[tuple[str, str], Destination] = {}
        self.aliases: dict[Destination, str] = {}
        self.inflight: collections.deque[asyncio.Future[None]] = collections.deque()
        self.inflight_items = 0  # messages and acknowledgements in the pipelined store writes
        self.sends: list[Any] = []  # SENDs of the current read not yet handed to the store (envelopes)
        self.receipts: collections.deque[list[Any]] = collections.deque()  # [receipt-id, writes awaited]
        self._tokens = itertools.count(1)
        self.closed = False
        self._finished = False
        self.last_read = self.last_write = time.monotonic()
        self.send_interval = 0.0
        self.recv_interval = 0.0
        self._heartbeat_task: asyncio.Task[None] | None = None
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self.loop = asyncio.get_running_loop()
        self._connect_timer = self.loop.call_later(settings.limits.connect_timeout, self._connect_timed_out)
        try:
            self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        except Exception:
            pass

    # ------------------------------------------------------------ I/O

    def new_token(self) -> str:
        return str(next(self._tokens))

    def write(self, data: bytes) -> None:
        if self.closed or self.transport.is_closing():
            raise ConnectionResetError("the STOMP connection is closed")
        self.transport.write(data)
        self.last_write = time.monotonic()

    async def drain_if_needed(self) -> None:
        if self.transport.get_write_buffer_size() > WRITE_HIGH_WATER:
            await self.writer.drain()

    def send_frame(self, command: str, headers: dict[str, Any], body: bytes = b"") -> None:
        self.write(encode(Frame(command, headers, body), self.version or "1.0"))

    async def blocking(self, fn: Any, *args: Any) -> Any:
        """Run a call that may wait on the store: inline on the memory store,
        in a thread otherwise (SQL writes must not stall the event loop)."""
        if self._sync_store:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    async def run(self) -> None:
        try:
            await self._read_loop()
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("STOMP connection %s failed", self.peer)
        finally:
            await self.finish()

    def _connect_timed_out(self) -> None:
        if self.version is None and not self.closed:
            self.error(
                "connect timeout",
                f"no CONNECT within {self.limits.connect_timeout:g} s of the connection; the connection is closed",
            )
            self.transport.close()

    async def _read_loop(self) -> None:
        reader = self.reader
        parser = self.parser
        busy_since = time.monotonic()
        while not self.closed:
            data = await reader.read(65536)
            if not data:
                return
            now = self.last_read = time.monotonic()
            if len(data) < 65536:  # the buffer is drained: the next read waits, giving the loop to others
                busy_since = now
            elif now - busy_since > BUSY_SLICE:  # one busy client does not hold the loop (it may serve HTTP too)
                await asyncio.sleep(0)
                busy_since = time.monotonic()
            try:
                frames = parser.feed(data)
            except FrameError as error:
                self.error("malformed frame", f"{error}\nThe connection is closed.")
                return
            try:
                await self._handle_read(frames)
            finally:  # what was accepted goes to the store, whatever comes next
                self.flush_sends()
            if self.closed:
                return

    async def _handle_read(self, frames: list[Frame]) -> None:
        """The frames of one read, in order (stops once the connection is closed)."""
        for frame in frames:
            try:
                await self.handle(frame)
            except ProtocolError as error:
                await self._error_after_receipts(error.message, error.detail, frame)
            except JMSError as error:
                await self._error_after_receipts(error_title(error), str(error), frame)
            except (ConnectionError, OSError):
                raise
            except Exception as error:
                log.exception("STOMP %s frame from %s failed", frame.command, self.peer)
                await self._error_after_receipts(
                    f"internal error: {error_title(error)}",
                    "the server failed processing this frame; see its log",
                    frame,
                )
            if self.closed:
                return

    async def _error_after_receipts(self, message: str, detail: str, frame: Frame) -> None:
        """The ERROR for *frame*, after the RECEIPTs asked for by the frames before it."""
        if self.receipts and not self.closed:
            await self.settle()
            self._write_receipts(every=True)
        self.error(message, detail, frame)

    def error(self, message: str, detail: str, frame: Frame | None = None) -> None:
        """Send an ERROR frame and close (after flushing it)."""
        if self.closed:
            return
        headers: dict[str, Any] = {"message": message.replace("\n", " ").replace("\r", " ")}
        if frame is not None and "receipt" in frame.headers:
            headers["receipt-id"] = frame.headers["receipt"]
        body = detail.encode("utf-8")
        headers["content-type"] = "text/plain"
        headers["content-length"] = len(body)
        try:
            self.send_frame("ERROR", headers, body)
        except (ConnectionError, OSError):
            pass
        self.closed = True
        log.info("STOMP ERROR to %s: %s", self.peer, message)

    def fail(self, error: BaseException) -> None:
        """An asynchronous failure (a pipelined store write): ERROR and close."""
        if self.closed:
            return
        self.error(error_title(error), str(error))
        self.transport.close()

    async def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self.closed = True
        self._connect_timer.cancel()
        if self.user is not None:
            per_user = self.settings.per_user
            per_user[self.login] = per_user.get(self.login, 1) - 1
            if per_user[self.login] <= 0:
                del per_user[self.login]
        held = sum(tx.held for tx in self.txs.values())
        if held:
            self.settings.memory.remove(held)
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        for sub in list(self.subs.values()):
            sub.closed = True
            if sub.task is not None:
                sub.task.cancel()
        for sub in list(self.subs.values()):
            if sub.task is not None:
                try:
                    await sub.task
                except BaseException:
                    pass
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=30)
        releases = [d for tx in self.txs.values() for d in tx.acks + tx.nacks]
        for tx in self.txs.values():
            tx.held = 0
        self.txs.clear()
        try:
            if releases:
                await self.blocking(self.store.release, releases, "the STOMP connection closed")
            if self.jms is not None:
                # closes every session: unacknowledged messages are redelivered
                await self.blocking(self.jms.close)
        except Exception:
            log.exception("closing the broker connection of %s failed", self.peer)
        try:
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), 5)
        except (Exception, asyncio.CancelledError):
            pass
        if self.on_closed is not None:
            self.on_closed(self)

    # ------------------------------------------------------------ pipelined store writes

    def flush_sends(self) -> None:
        """Hand the SENDs held so far to the store: one commit, in their order."""
        sends = self.sends
        if sends:
            self.sends = []
            self.track(_store_commit_async(self.store, sends, (), loop=self.loop), len(sends))

    def track(self, future: asyncio.Future[None], items: int = 1) -> None:
        inflight = self.inflight
        while inflight and inflight[0].done():
            inflight.popleft()
        if future.done():
            if future.exception() is not None:
                self.fail(future.exception())  # type: ignore[arg-type]
            return
        self.inflight_items += items
        future.add_done_callback(functools.partial(self._settled, items))
        inflight.append(future)

    def _settled(self, items: int, future: asyncio.Future[None]) -> None:
        self.inflight_items -= items
        if not future.cancelled() and future.exception() is not None:
            self.fail(future.exception())  # type: ignore[arg-type]

    def _receipt_later(self, receipt: str) -> None:
        """Write the RECEIPT of a SEND once every store write so far is done, without waiting for it:
        a producer asking for a receipt now and then keeps its SENDs flowing. Receipts go out in order."""
        self.flush_sends()
        pending = [f for f in self.inflight if not f.done()]
        entry = [receipt, len(pending)]
        self.receipts.append(entry)
        if not pending:
            self._write_receipts()
            return

        def one_done(future: asyncio.Future[None]) -> None:
            entry[1] -= 1  # a failed write closed the connection first (its callback came earlier): no RECEIPT
            if entry[1] == 0:
                self._write_receipts()

        for future in pending:
            future.add_done_callback(one_done)

    def _write_receipts(self, every: bool = False) -> None:
        """Write the receipts whose store writes are done, in order (*every*: all of them, once settled)."""
        receipts = self.receipts
        while receipts and (every or receipts[0][1] == 0):
            receipt = receipts.popleft()[0]
            if not self.closed:
                try:
                    self.send_frame("RECEIPT", {"receipt-id": receipt})
                except (ConnectionError, OSError):
                    pass

    async def settle(self) -> None:
        """Wait until every pipelined store write so far is done."""
        self.flush_sends()
        inflight = self.inflight
        if inflight:
            pending = [f for f in inflight if not f.done()]
            inflight.clear()
            if pending:
                await asyncio.wait(pending)

    async def _throttle(self) -> None:
        inflight = self.inflight
        while inflight and inflight[0].done():
            inflight.popleft()
        while inflight and self.inflight_items >= MAX_INFLIGHT:
            await asyncio.wait([inflight[0]])
            while inflight and inflight[0].done():
                inflight.popleft()

    # ------------------------------------------------------------ destinations

    def destination_text(self, destination: Destination) -> str:
        if destination.is_temporary:
            alias = self.aliases.get(destination)
            prefix = "/temp-topic/" if destination.is_topic else "/temp-queue/"
            return prefix + (alias if alias is not None else destination.name)
        return ("/topic/" if destination.is_topic else "/queue/") + destination.name

    def resolve(self, text: str, purpose: str = "send") -> Destination:
        """The destination *text* names, for *purpose* (``send``, ``consume``,
        ``browse`` or ``reply-to``), if this user may use it so. A temporary
        destination of another connection is returned for ``send`` only: the
        caller checks the reply grant (:meth:`check_foreign_send`)."""
        kind, name = split_destination(text)
        if kind == "queue" or kind == "topic":
            action = "send" if purpose == "reply-to" else purpose
            if not self.user.may(action, kind, name):
                raise ProtocolError(
                    "not authorised",
                    f"user {self.login!r} may not {_VERBS[purpose]} {text}; the "
                    f"operator grants it in stomp.users.{self.login}.{action}",
                )
            return Queue(name) if kind == "queue" else Topic(name)
        topic = kind.endswith("topic")
        cls = TemporaryTopic if topic else TemporaryQueue
        if not kind.startswith("remote-"):
            own = self.temps.get((kind, name))
            if own is not None:
                return own
        try:
            foreign = cls(name)
        except InvalidDestinationError:
            foreign = None
        if foreign is not None and foreign in self.aliases:
            return foreign  # this connection's own, by the name others see
        if foreign is not None and (foreign in self.broker._temporaries or self.store.temporary_exists(foreign)):
            if purpose == "send":
                return foreign
            raise ProtocolError(
                "not authorised",
                f"{text} is another connection's temporary destination: only the "
                "connection that created it may "
                + ("name it in reply-to" if purpose == "reply-to" else "consume or browse it"),
            )
        if kind.startswith("remote-"):
            raise InvalidDestinationError(f"{text}: no such temporary destination (its connection closed?)")
        if len(self.temps) >= self.limits.temporary_destinations:
            raise ProtocolError(
                "too many temporary destinations",
                f"this connection already created {len(self.temps)} temporary destinations (the "
                "limit); reuse them by name",
            )
        temp = self.jms.create_temporary_topic() if topic else self.jms.create_temporary_queue()
        self.temps[(kind, name)] = temp
        self.aliases[temp] = name
        return temp

    def check_foreign_send(self, destination: Destination, text: str, correlation_id: str | None) -> None:
        """Refuse a SEND to another connection's temporary destination unless it
        replies to a message this user consumed (``_grants``)."""
        if not self.settings.grants.allows(self.login, destination, correlation_id):
            raise ProtocolError(
                "not authorised",
                f"{text} is another connection's temporary destination: a user "
                "may send there only a reply to a message it consumed whose reply-to named it, with "
                "the correlation-id that message asks for (its correlation-id, else its message-id)",
            )

    # ------------------------------------------------------------ frames

    async def handle(self, frame: Frame) -> None:
        command = frame.command
        if self.version is None:
            if command not in ("CONNECT", "STOMP"):
                raise ProtocolError("not connected", f"the first frame must be CONNECT (or STOMP), got {command}")
            await self._connect(frame)
            return
        if command != "SEND":  # what follows the SENDs held sees them stored (an ACK, a COMMIT, ...)
            self.flush_sends()
        handler = _HANDLERS.get(command)
        if handler is None:
            if command in ("CONNECT", "STOMP"):
                raise ProtocolError("already connected", "CONNECT was sent twice on one connection")
            raise ProtocolError(
                f"unknown command {command[:40]}",
                "valid commands: SEND, SUBSCRIBE, UNSUBSCRIBE, ACK, NACK, BEGIN, COMMIT, ABORT, DISCONNECT",
            )
        await handler(self, frame)
        receipt = frame.headers.get("receipt")
        if receipt is not None and not self.closed:
            if command == "SEND" and len(self.receipts) < MAX_INFLIGHT:
                self._receipt_later(receipt)  # the frames after it are read and handled meanwhile
                return
            await self.settle()
            self._write_receipts(every=True)
            self.send_frame("RECEIPT", {"receipt-id": receipt})
            await self.drain_if_needed()
        if command == "DISCONNECT":
            self.closed = True

    async def _connect(self, frame: Frame) -> None:
        headers = frame.headers
        offered = [v.strip() for v in headers.get("accept-version", "1.0").split(",")]
        version = next((v for v in VERSIONS if v in offered), None)
        if version is None:
            self.version = "1.0"
            self.write(
                encode(
                    Frame(
                        "ERROR",
                        {
                            "version": ",".join(reversed(VERSIONS)),
                            "content-type": "text/plain",
                            "message": "unsupported protocol version",
                        },
                        f"Supported protocol versions are {', '.join(reversed(VERSIONS))}; the client "
                        f"offered {headers.get('accept-version')!r}".encode(),
                    ),
                    "1.0",
                )
            )
            self.closed = True
            return
        login = headers.get("login")
        try:
            user = await self.settings.authenticator.check(login, headers.get("passcode"), self.address)
        except AuthenticationError as error:
            self.version = version
            raise ProtocolError(error.title, str(error)) from None
        if self.closed:  # timed out while the passcode was checked
            return
        per_user = self.settings.per_user
        if per_user.get(user.login, 0) >= self.limits.connections_per_user:
            self.version = version
            raise ProtocolError(
                "too many connections for this user",
                f"user {user.login!r} already has {per_user[user.login]} connections (the limit)",
            )
        client_id = headers.get("client-id") or None
        if client_id is not None:
            owner = self.settings.client_owners.get(client_id)
            if not user.may_claim(client_id) or (owner is not None and owner != user.login):
                self.version = version
                raise ProtocolError(
                    "client-id not allowed",
                    f"user {user.login!r} may not use client-id {client_id[:100]!r}: it belongs to "
                    "another user, or is not one of this user's client_ids (by default the login and "
                    "LOGIN.anything)",
                )
        cx = cy = 0
        if version != "1.0" and "heart-beat" in headers:
            try:
                cx, cy = (int(p) for p in headers["heart-beat"].split(","))
                if cx < 0 or cy < 0:
                    raise ValueError
            except ValueError:
                self.version = version
                raise ProtocolError(
                    "invalid heart-beat header",
                    f"heart-beat must be two non-negative integers 'cx,cy', got {headers['heart-beat']!r}",
                ) from None
        sx, sy = self.settings.heartbeat if version != "1.0" else (0, 0)
        self.version = version
        self.parser.version = version
        try:
            self.jms = self.broker.connect(client_id=client_id, user=user.login)
        except JMSError as error:
            raise ProtocolError(error_title(error), str(error)) from None
        self._connect_timer.cancel()
        self.last_read = self.last_write = time.monotonic()  # the passcode check took its time
        self.user = user
        self.login = user.login
        per_user[user.login] = per_user.get(user.login, 0) + 1
        if client_id is not None and len(self.settings.client_owners) < MAX_CLIENT_IDS:
            self.settings.client_owners.setdefault(client_id, user.login)
        settings = self.settings
        self.parser.max_frame_size = settings.max_frame_size
        self.parser.max_headers = settings.max_headers
        self.parser.max_header_bytes = settings.max_header_bytes
        self.session = self.jms.create_session(False, AckMode.AUTO)
        self.producer = self.session.create_producer(None)
        self.jms.start()
        self.send_interval = max(sx, cy) / 1000 if sx and cy else 0.0
        self.recv_interval = max(cx, sy) / 1000 if cx and sy else 0.0
        reply = {"version": version, "server": "b2bgw-stomp/1.0", "session": self.jms._id}
        if version != "1.0":
            reply["heart-beat"] = f"{sx},{sy}"
        self.send_frame("CONNECTED", reply)
        if self.send_interval or self.recv_interval:
            self._heartbeat_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        intervals = [i for i in (self.send_interval, self.recv_interval) if i]
        tick = min(intervals) / 2
        try:
            while not self.closed:
                await asyncio.sleep(tick)
                now = time.monotonic()
                if self.send_interval and now - self.last_write >= self.send_interval / 2:
                    self.write(b"\n")
                if self.recv_interval and now - self.last_read > self.recv_interval * 2:
                    self.error(
                        "heart-beat timeout",
                        f"nothing received for {now - self.last_read:.1f} s; the negotiated heart-beat is "
                        f"{self.recv_interval * 1000:.0f} ms",
                    )
                    self.transport.close()
                    return
        except (ConnectionError, OSError):
            self.transport.close()

    def _required(self, frame: Frame, name: str) -> str:
        value = frame.headers.get(name)
        if value is None or value == "":
            raise ProtocolError(f"missing {name} header", f"a {frame.command} frame needs a {name} header")
        return value

    def _transaction(self, frame: Frame) -> _Transaction | None:
        name = frame.headers.get("transaction")
        if name is None:
            return None
        tx = self.txs.get(name)
        if tx is None:
            raise ProtocolError("unknown transaction", f"transaction {name!r} was not begun (or is already over)")
        return tx

    async def on_send(self, frame: Frame) -> None:
        text = self._required(frame, "destination")
        destination = self.resolve(text)
        if destination.is_temporary and destination not in self.aliases:
            self.check_foreign_send(destination, text, frame.headers.get("correlation-id"))
        message, mode, priority, ttl = message_from_send(
            frame.headers, frame.body, self._resolve_reply_to, self.settings.string_numbers
        )
        memory = self.settings.memory
        tx = self._transaction(frame)
        if tx is not None:
            self._count(tx)
            size = len(frame.body) + MESSAGE_OVERHEAD
            if memory.full:
                await self._wait_for_memory()
            tx.producer.send(destination, message, delivery_mode=mode, priority=priority, time_to_live=ttl)
            tx.held += size
            memory.add(size)
            return
        env = self.producer._envelope(destination, message, mode, priority, ttl, None)
        if self._sync_store or env.delivery_mode == NON_PERSISTENT:  # held in memory until consumed
            if memory.full:
                await self._wait_for_memory()
            memory.track(env, len(frame.body) + MESSAGE_OVERHEAD)
        if self._sync_store or (mode == DeliveryMode.NON_PERSISTENT and not destination.is_temporary):
            self.store.send(env)
        else:
            await self._throttle()
            self.sends.append(env)  # committed with the other SENDs of this read (see flush_sends)
            if len(self.sends) >= SEND_BATCH:
                self.flush_sends()

    def _resolve_reply_to(self, text: str) -> Destination:
        return self.resolve(text, "reply-to")

    def _count(self, tx: _Transaction) -> None:
        tx.count += 1
        if tx.count > self.limits.transaction_messages:
            raise ProtocolError(
                "transaction too large",
                f"a transaction holds at most "
                f"{self.limits.transaction_messages} SENDs, ACKs and NACKs; commit more often",
            )

    async def _wait_for_memory(self) -> None:
        """Producer flow control: wait (the socket is not read meanwhile) until
        the listener's messages take less than its memory limit, or refuse."""
        memory = self.settings.memory
        deadline = time.monotonic() + self.limits.send_wait
        delay = 0.005
        while memory.full:
            if time.monotonic() >= deadline:
                raise ProtocolError(
                    "memory limit reached",
                    f"the listener's messages in memory reached its limit ({memory.limit} bytes) and "
                    f"no room was freed within {self.limits.send_wait:g} s: consume what was sent, "
                    "send persistent messages, or retry later",
                )
            await asyncio.sleep(delay)
            delay = min(0.1, delay * 2)

    async def on_subscribe(self, frame: Frame) -> None:
        headers = frame.headers
        text = self._required(frame, "destination")
        sub_id = headers.get("id")
        if sub_id is None:
            if self.version != "1.0":
                raise ProtocolError("missing id header", "SUBSCRIBE needs an id header (STOMP 1.1 and 1.2)")
            sub_id = text
        if sub_id in self.subs:
            raise ProtocolError("duplicate subscription id", f"subscription id {sub_id!r} is already in use")
        if len(self.subs) >= self.limits.subscriptions:
            raise ProtocolError(
                "too many subscriptions",
                f"this connection already has {len(self.subs)} subscriptions (the limit); UNSUBSCRIBE some first",
            )
        ack = headers.get("ack", "auto")
        if ack not in ("auto", "client", "client-individual"):
            raise ProtocolError("invalid ack mode", f"ack must be auto, client or client-individual, got {ack!r}")
        raw = headers.get("activemq.prefetchSize") or headers.get("prefetch") or headers.get("prefetch-count")
        prefetch = self.settings.prefetch
        if raw is not None:
            try:
                prefetch = int(raw)
                if prefetch < 1:
                    raise ValueError
            except ValueError:
                raise ProtocolError("invalid prefetch", f"prefetch must be a positive integer, got {raw!r}") from None
        selector = headers.get("selector") or None
        browse = headers.get("browser", "false").lower() == "true"
        destination = self.resolve(text, "browse" if browse else "consume")
        if browse:
            await self._browse(sub_id, destination, selector)
            return
        durable_name = headers.get("durable-subscription-name") or headers.get("activemq.subscriptionName")
        no_local = (headers.get("no-local") or headers.get("activemq.noLocal") or "false").lower() == "true"
        session = self.jms.create_session(False, AckMode.AUTO if ack == "auto" else AckMode.INDIVIDUAL)
        try:
            if durable_name:
                if not destination.is_topic or destination.is_temporary:
                    raise ProtocolError("durable subscriptions need a topic", f"{text} is not a /topic/ destination")
                if self.jms.client_id is None:
                    raise ProtocolError(
                        "durable subscriptions need a client-id",
                        "send a client-id header in CONNECT to use durable subscriptions",
                    )
                consumer = session.create_durable_subscriber(destination, durable_name, selector, no_local)
            else:
                # the subscription's prefetch is also the most the store claims for it at once (ActiveMQ's
                # prefetch: messages dispatched ahead), up to CLAIM_MAX whatever a client asks: the store's
                # default (64) starves a consumer while producers keep its writer busy, each claim waiting
                # behind their commits. A selective subscription claims its candidates in windows of its own.
                consumer = session.create_consumer(
                    destination, selector, no_local, prefetch=min(prefetch, CLAIM_MAX) if selector is None else None
                )
        except BaseException:
            session.close()
            raise
        sub = StompSubscription(self, sub_id, destination, ack, prefetch, session, consumer, durable_name)
        self.subs[sub_id] = sub
        sub.start()

    async def _browse(self, sub_id: str, destination: Destination, selector: str | None) -> None:
        if not isinstance(destination, Queue) or destination.is_topic:
            raise ProtocolError("only queues can be browsed", "browser:true needs a /queue/ destination")
        browser = self.session.create_browser(destination, selector)
        version = self.version or "1.2"
        try:
            chunks: list[bytes] = []
            for message_env in _browse_envelopes(self, destination, selector):
                chunks.append(encode_message(message_env, sub_id, None, False, version, self.destination_text))
                if len(chunks) >= BATCH:
                    self.write(b"".join(chunks))
                    chunks = []
                    await self.drain_if_needed()
            if chunks:
                self.write(b"".join(chunks))
        finally:
            browser.close()
        self.send_frame(
            "MESSAGE",
            {
                "subscription": sub_id,
                "destination": self.destination_text(destination),
                "message-id": "BrowseDone",
                "browser": "end",
            },
        )

    async def on_unsubscribe(self, frame: Frame) -> None:
        headers = frame.headers
        sub_id = headers.get("id")
        if sub_id is None:
            if self.version != "1.0" or "destination" not in headers:
                raise ProtocolError("missing id header", "UNSUBSCRIBE needs the id of the SUBSCRIBE")
            sub_id = headers["destination"]
        sub = self.subs.pop(sub_id, None)
        durable_name = headers.get("durable-subscription-name") or headers.get("activemq.subscriptionName")
        if sub is None and not durable_name:
            raise ProtocolError("unknown subscription", f"no subscription with id {sub_id!r}")
        if sub is not None:
            await sub.close()
        if durable_name:  # also delete the durable subscription and its messages
            self.session.unsubscribe(durable_name)

    def _ack_target(self, frame: Frame) -> tuple[StompSubscription, str]:
        headers = frame.headers
        if self.version == "1.2":
            token = self._required(frame, "id")
            sub = self.acks.get(token)
            if sub is None:
                raise ProtocolError(
                    "unknown ack id",
                    f"no unacknowledged message has ack id {token!r}; it was "
                    "acknowledged already, or belongs to an auto-ack subscription",
                )
            return sub, token
        message_id = self._required(frame, "message-id")
        sub_id = headers.get("subscription")
        candidates = [self.subs[sub_id]] if sub_id in self.subs else list(self.subs.values())
        if sub_id is None and self.version == "1.1":
            raise ProtocolError("missing subscription header", "ACK and NACK need a subscription header in STOMP 1.1")
        for sub in candidates:
            token = sub.by_message_id.get(message_id)
            if token is not None:
                return sub, token
        raise ProtocolError("unknown message-id", f"no unacknowledged message {message_id!r}")

    async def on_ack(self, frame: Frame) -> None:
        sub, token = self._ack_target(frame)
        tx = self._transaction(frame)
        if tx is not None:
            self._count(tx)
        deliveries = sub.take(token, sub.ack == "client")
        if tx is not None:
            tx.acks.extend(deliveries)
        elif deliveries:
            await self._throttle()
            self.track(_store_commit_async(self.store, (), deliveries, loop=self.loop), len(deliveries))

    async def on_nack(self, frame: Frame) -> None:
        if self.version == "1.0":
            raise ProtocolError("unknown command NACK", "NACK is a STOMP 1.1 command")
        sub, token = self._ack_target(frame)
        tx = self._transaction(frame)
        if tx is not None:
            self._count(tx)
        deliveries = sub.take(token, False)
        if tx is not None:
            tx.nacks.extend(deliveries)
        else:
            await self.blocking(self.store.release, deliveries, "NACK from the STOMP client")

    async def on_begin(self, frame: Frame) -> None:
        name = self._required(frame, "transaction")
        if name in self.txs:
            raise ProtocolError("transaction already begun", f"transaction {name!r} is already open")
        if len(self.txs) >= self.limits.transactions:
            raise ProtocolError(
                "too many transactions",
                f"this connection already has {len(self.txs)} open "
                "transactions (the limit); COMMIT or ABORT some first",
            )
        self.txs[name] = _Transaction(self.jms.create_session(True))

    async def on_commit(self, frame: Frame) -> None:
        self._required(frame, "transaction")
        tx = self._transaction(frame)
        assert tx is not None
        del self.txs[frame.headers["transaction"]]
        self._release_held(tx)
        staged, _consumed = tx.session._take_transaction()
        memory = self.settings.memory
        for env in staged:
            if self._sync_store or env.delivery_mode == NON_PERSISTENT:
                memory.track(env, _envelope_size(env))
        try:
            if staged or tx.acks:
                await self.settle()
                await _store_commit_async(self.store, staged, tx.acks, loop=self.loop)
            if tx.nacks:
                await self.blocking(self.store.release, tx.nacks, "NACK from the STOMP client")
        finally:
            tx.session.close()

    async def on_abort(self, frame: Frame) -> None:
        self._required(frame, "transaction")
        tx = self._transaction(frame)
        assert tx is not None
        del self.txs[frame.headers["transaction"]]
        self._release_held(tx)
        tx.session.rollback()
        tx.session.close()
        released = tx.acks + tx.nacks
        if released:  # the transaction's acknowledgements are undone: redelivered
            await self.blocking(self.store.release, released, "the STOMP transaction was aborted")

    async def on_disconnect(self, frame: Frame) -> None:
        await self.settle()

    def _release_held(self, tx: _Transaction) -> None:
        if tx.held:
            self.settings.memory.remove(tx.held)
            tx.held = 0


def _envelope_size(env: Any) -> int:
    body = env.body
    size = len(body) if isinstance(body, (str, bytes)) else 0
    return size + MESSAGE_OVERHEAD


def _browse_envelopes(conn: StompConnection, queue: Destination, selector: str | None) -> Any:
    from .._store import queue_box

    return conn.store.browse(queue_box(queue), selector)


_HANDLERS = {
    "SEND": StompConnection.on_send,
    "SUBSCRIBE": StompConnection.on_subscribe,
    "UNSUBSCRIBE": StompConnection.on_unsubscribe,
    "ACK": StompConnection.on_ack,
    "NACK": StompConnection.on_nack,
    "BEGIN": StompConnection.on_begin,
    "COMMIT": StompConnection.on_commit,
    "ABORT": StompConnection.on_abort,
    "DISCONNECT": StompConnection.on_disconnect,
}
