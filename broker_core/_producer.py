"""Message producers: a message stamped, turned into its envelope and sent,
or staged in the session's transaction."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from ._commit import store_commit_async
from ._constants import DEFAULT_PRIORITY, DeliveryMode
from ._destinations import Destination
from ._envelope import NON_PERSISTENT
from ._errors import IllegalStateError, InvalidArgumentError, InvalidDestinationError
from ._message import Message

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["MessageProducer"]


class MessageProducer:
    """Sends messages, to its destination or (unidentified) to the one named
    at each send. ``delivery_mode``, ``priority`` and ``time_to_live`` (ms)
    are the defaults for its sends: PERSISTENT, 4 and 0 (never expires)."""

    def __init__(self, session: Session, destination: Destination | None) -> None:
        self._session = session
        self._broker = session._broker
        self.destination = destination
        self.delivery_mode = DeliveryMode.PERSISTENT
        self.priority = DEFAULT_PRIORITY
        self.time_to_live = 0
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MessageProducer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> MessageProducer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def send(
        self,
        *args: Destination | Message,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> None:
        """``send(message)`` on a producer with a destination, or
        ``send(destination, message)`` on an unidentified one. Sets the sent
        message's ``jms_message_id``, ``jms_timestamp`` and the other headers."""
        destination, message = self._target(args)
        self._send(destination, message, delivery_mode, priority, time_to_live, None)

    def send_async(
        self,
        *args: Destination | Message,
        delivery_mode: int | None = None,
        priority: int | None = None,
        time_to_live: int | None = None,
    ) -> asyncio.Future[None]:
        """Like :meth:`send`, for asyncio (JMS 2.0's asynchronous send):
        ``await producer.send_async(message)`` returns once the message is
        stored (durably, when persistent) without blocking the event loop;
        many concurrent sends share commits. What it returns is a plain
        future of the running loop (no task per send): gather it, or add a
        done callback. Invalid arguments raise at the call. In a transacted
        session the message is staged and the future is already done."""
        destination, message = self._target(args)
        env = self._envelope(destination, message, delivery_mode, priority, time_to_live, None)
        self._stamp(message, env)  # before the commit: code running inside it can read jms_message_id
        if self._session.transacted:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stage(env)
            future.set_result(None)
            return future
        return store_commit_async(self._broker.store, (env,), ())

    def _target(self, args: tuple[Any, ...]) -> tuple[Destination, Message]:
        if len(args) == 1:
            if self.destination is None:
                raise InvalidDestinationError("this producer has no destination: use send(destination, message)")
            return self.destination, args[0]
        if len(args) == 2:
            if self.destination is not None:
                raise InvalidDestinationError(
                    f"this producer sends to {self.destination}; use an unidentified producer to name destinations"
                )
            self._session._check_destination(args[0])
            return args[0], args[1]
        raise TypeError("send() takes (message) or (destination, message)")

    def _send(
        self,
        destination: Destination,
        message: Message,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
        message_id: str | None,
    ) -> None:
        env = self._envelope(destination, message, delivery_mode, priority, time_to_live, message_id)
        if self._session.transacted:
            self._stage(env)
        else:
            self._broker.store.send(env)
        self._stamp(message, env)

    def _stage(self, env: Any) -> None:
        session = self._session
        with session._lock:
            session._staged.append(env)

    @staticmethod
    def _stamp(message: Message, env: Any) -> None:
        """Set the headers JMS sets on a sent message."""
        message.jms_message_id = env.message_id
        message.jms_destination = env.destination
        message.jms_delivery_mode = env.delivery_mode
        message.jms_priority = env.priority
        message.jms_timestamp = env.timestamp
        message.jms_expiration = env.expiration

    def _envelope(
        self,
        destination: Destination,
        message: Message,
        delivery_mode: int | None,
        priority: int | None,
        time_to_live: int | None,
        message_id: str | None,
    ) -> Any:
        """Check the arguments and snapshot ``message`` for sending."""
        session = self._session
        if self._closed:
            raise IllegalStateError("the producer is closed")
        if session._closed or session._connection._closed:
            session._check_open()
        if not isinstance(message, Message):
            raise InvalidArgumentError(f"send() takes a Message, got {type(message).__name__}")
        mode = self.delivery_mode if delivery_mode is None else delivery_mode
        if mode != 2 and mode != 1:
            raise InvalidArgumentError(f"delivery_mode must be DeliveryMode.PERSISTENT or NON_PERSISTENT, got {mode!r}")
        prio = self.priority if priority is None else priority
        if prio.__class__ is not int or not 0 <= prio <= 9:
            if isinstance(prio, bool) or not isinstance(prio, int) or not 0 <= prio <= 9:
                raise InvalidArgumentError(f"priority must be an int from 0 to 9, got {prio!r}")
        ttl = self.time_to_live if time_to_live is None else time_to_live
        if not isinstance(ttl, int) or ttl < 0:
            raise InvalidArgumentError(f"time_to_live must be a non-negative int of milliseconds, got {ttl!r}")
        broker = self._broker
        if destination.is_temporary:
            if destination not in broker._temporaries and not broker.store.temporary_exists(destination):
                raise InvalidDestinationError(
                    f"{destination} does not exist any more (deleted, or its connection closed)"
                )
            mode = NON_PERSISTENT
        connection = session._connection
        timestamp = int(time.time() * 1000)
        if message_id is None:
            message_id = f"ID:{broker.instance_id}-{next(broker._ids)}"
        env = message._to_envelope(
            message_id, destination, mode, prio, timestamp + ttl if ttl else 0, timestamp, connection.origin
        )
        if connection.user is not None:  # stamped on the sent copy: a received message stays forwardable
            env.properties["JMSXUserID"] = connection.user
        return env
