"""Connections: a client's (or an application's) sessions, temporary
destinations and client id, started and stopped together."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ._commit import close_off_loop
from ._constants import AckMode
from ._destinations import Destination, TemporaryQueue, TemporaryTopic
from ._errors import IllegalStateError, InvalidClientIDError, InvalidDestinationError
from ._session import Session
from ._store import queue_box

if TYPE_CHECKING:
    from ._broker import Broker

__all__ = ["Connection"]


class Connection:
    """A client's connection: makes sessions and temporary destinations.

    Created stopped: consumers receive nothing until :meth:`start`. Also a
    context manager, plain or ``async with``, that closes it.
    """

    def __init__(self, broker: Broker, client_id: str | None, user: str | None) -> None:
        self._broker = broker
        self._id = f"{broker.instance_id}-c{next(broker._ids)}"
        self._client_id: str | None = None
        self.user = user
        self._started = False
        self._closed = False
        self._used = False
        self._sessions: list[Any] = []
        self._temporaries: list[Destination] = []
        self._temp_ids = itertools.count(1)
        if client_id is not None:
            self.client_id = client_id
        with broker._lock:
            broker._connections.add(self)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self._broker.store, self.close)

    def __repr__(self) -> str:
        return f"<Connection {self._id} client_id={self._client_id!r}>"

    @property
    def broker(self) -> Broker:
        return self._broker

    @property
    def client_id(self) -> str | None:
        return self._client_id

    @client_id.setter
    def client_id(self, value: str) -> None:
        self._check_open()
        if self._client_id is not None or self._used:
            raise IllegalStateError("the client id can only be set once, before the connection is used")
        if not isinstance(value, str) or not value.strip():
            raise InvalidClientIDError(f"client id must be a non-empty string, got {value!r}")
        with self._broker._lock:
            if value in self._broker._client_ids:
                raise InvalidClientIDError(f"client id {value!r} is already used by another open connection")
            self._broker._client_ids.add(value)
        self._client_id = value

    @property
    def origin(self) -> str:
        """What ``no_local`` compares: the client id, else the connection id."""
        return self._client_id or self._id

    @property
    def started(self) -> bool:
        return self._started

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the connection is closed")

    def start(self) -> None:
        """Start (or restart) delivery to this connection's consumers."""
        self._check_open()
        self._used = True
        self._started = True
        for session in list(self._sessions):
            session._wake_all()

    def stop(self) -> None:
        """Pause delivery; returns once running listeners have returned."""
        self._check_open()
        self._started = False
        for session in list(self._sessions):
            session._wait_listener_idle()

    def close(self) -> None:
        """Close sessions (rolling back transactions and redelivering what was
        not acknowledged), delete temporary destinations, free the client id."""
        if self._closed:
            return
        self._started = False
        for session in list(self._sessions):
            session.close()
        for temp in list(self._temporaries):
            self._delete_temporary(temp, force=True)
        broker = self._broker
        with broker._lock:
            if self._client_id is not None:
                broker._client_ids.discard(self._client_id)
            broker._connections.discard(self)
        self._closed = True

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO) -> Session:
        """A session: transacted (its ack mode is then ignored) or not."""
        self._check_open()
        self._used = True
        session = Session(self, bool(transacted), ack_mode)
        self._sessions.append(session)
        return session

    def create_temporary_queue(self) -> TemporaryQueue:
        """A queue only this connection consumes from; gone when it closes."""
        return self._create_temporary(TemporaryQueue)

    def create_temporary_topic(self) -> TemporaryTopic:
        """A topic only this connection subscribes to; gone when it closes."""
        return self._create_temporary(TemporaryTopic)

    def _create_temporary(self, cls: type) -> Any:
        self._check_open()
        self._used = True
        temp = cls(f"ID:{self._id}-{'tq' if cls is TemporaryQueue else 'tt'}{next(self._temp_ids)}", self)
        broker = self._broker
        with broker._lock:
            broker._temporaries[temp] = self
        if not temp.is_topic:
            broker.store.create_queue(queue_box(temp), temp)
        broker.store.register_temporary(temp)
        self._temporaries.append(temp)
        return temp

    def _delete_temporary(self, temp: Destination, force: bool = False) -> None:
        broker = self._broker
        with broker._lock:
            if broker._temporaries.get(temp) is not self:
                if force:
                    return
                raise InvalidDestinationError(f"{temp} does not exist any more")
            if not force:
                for session in self._sessions:
                    if any(c._destination == temp for c in session._consumers):
                        raise IllegalStateError(f"{temp} still has consumers; close them before deleting it")
            del broker._temporaries[temp]
        if temp in self._temporaries:
            self._temporaries.remove(temp)
        broker.store.unregister_temporary(temp)
        if not temp.is_topic:
            broker.store.delete_box(queue_box(temp))

    def _session_closed(self, session: Any) -> None:
        if session in self._sessions:
            self._sessions.remove(session)
