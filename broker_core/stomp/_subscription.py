"""A STOMP SUBSCRIBE: its consumer, the task that delivers its messages, and its unacknowledged ones."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .._destinations import Destination
from .._store import Delivery, now_ms
from .._waiters import AsyncWaiter
from ._mapping import encode_message
from ._protocol import ProtocolError

if TYPE_CHECKING:
    from ._connection import StompConnection

__all__ = ["BATCH", "StompSubscription"]

log = logging.getLogger(__name__)

BATCH = 64  # messages claimed and written per socket write


class StompSubscription:
    """A SUBSCRIBE: a consumer and the task that delivers its messages."""

    def __init__(
        self,
        conn: StompConnection,
        sub_id: str,
        destination: Destination,
        ack: str,
        prefetch: int,
        session: Any,
        consumer: Any,
        durable_name: str | None,
    ) -> None:
        self.conn = conn
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.auto = ack == "auto"
        self.prefetch = prefetch
        self.session = session
        self.consumer = consumer
        self.durable_name = durable_name
        self.pending: dict[str, Delivery] = {}  # ack token -> delivery, in delivery order
        self.by_message_id: dict[str, str] = {}
        self.window = asyncio.Event()
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._pump())

    async def _pump(self) -> None:
        conn = self.conn
        consumer = self.consumer
        reader = consumer._reader
        session = self.session
        auto = self.auto
        waiter = AsyncWaiter()
        consumer._waiter = waiter  # the broker wakes it when the box gets messages
        version = conn.version
        ack_header = version == "1.2"
        pending = self.pending
        grant = conn.settings.grants.grant
        login = conn.login
        try:
            while not self.closed and not conn.closed:
                room = BATCH if auto else min(BATCH, self.prefetch - len(pending))
                if room <= 0:
                    self.window.clear()
                    await self.window.wait()
                    continue
                chunks = []
                now = now_ms()
                while room > 0:
                    if not reader.claim_may_wait(now):
                        delivery = reader.claim(now, auto)
                    elif chunks:  # what is claimed goes out before a claim that waits for the store
                        break
                    else:  # the store's writer claims: the loop serves the other clients meanwhile
                        delivery = await reader.claim_async(now, auto)
                    if delivery is None:
                        break
                    room -= 1
                    env = delivery.envelope
                    if env.reply_to is not None and env.reply_to.is_temporary:
                        grant(login, env.reply_to, env.correlation_id or env.message_id)
                    token = None
                    if not auto:
                        token = conn.new_token()
                        pending[token] = delivery
                        self.by_message_id[delivery.envelope.message_id] = token
                        conn.acks[token] = self
                        with session._lock:  # so that closing the session redelivers it
                            session._unacked[id(delivery)] = delivery
                    chunks.append(
                        encode_message(
                            delivery.envelope,
                            self.id,
                            token if ack_header else None,
                            delivery.count > 1,
                            version,
                            conn.destination_text,
                        )
                    )
                if chunks:
                    conn.write(b"".join(chunks) if len(chunks) > 1 else chunks[0])
                    await conn.drain_if_needed()
                    continue
                ready = reader.next_ready()
                timeout = None if ready is None else max(0.0, (ready - now_ms()) / 1000) + 0.001
                await waiter.wait(timeout)
        except asyncio.CancelledError:
            raise
        except (ConnectionError, OSError):
            conn.closed = True
        except Exception as error:  # a store failure: tell the client, close
            log.exception("delivery to subscription %s failed", self.id)
            conn.fail(error)

    def take(self, token: str, cumulative: bool) -> list[Delivery]:
        """Remove and return the deliveries an ACK/NACK of ``token`` covers."""
        pending = self.pending
        if token not in pending:
            raise ProtocolError(
                "unknown ack id",
                f"no unacknowledged message with ack id {token!r} on "
                f"subscription {self.id!r}; it was acknowledged already or never delivered",
            )
        taken: list[tuple[str, Delivery]] = []
        if cumulative:
            for key in list(pending):
                taken.append((key, pending.pop(key)))
                if key == token:
                    break
        else:
            taken.append((token, pending.pop(token)))
        acks = self.conn.acks
        unacked = self.session._unacked
        with self.session._lock:
            for _, delivery in taken:
                unacked.pop(id(delivery), None)
        for key, delivery in taken:
            acks.pop(key, None)
            self.by_message_id.pop(delivery.envelope.message_id, None)
        self.window.set()
        return [d for _, d in taken]

    async def close(self) -> None:
        """Stop delivering; unacknowledged messages are redelivered."""
        if self.closed:
            return
        self.closed = True
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except BaseException:
                pass
        for token in self.pending:
            self.conn.acks.pop(token, None)
        self.pending.clear()
        await self.conn.blocking(self.session.close)
