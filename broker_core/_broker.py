"""The broker and its connections."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import uuid
from typing import Any, Callable, Iterator

from ._constants import AckMode
from ._destinations import Destination, Queue, TemporaryQueue, TemporaryTopic, parse_destination
from ._errors import IllegalStateError, InvalidArgumentError, InvalidClientIDError, InvalidDestinationError
from ._message import Message, message_from_envelope
from ._options import check_options, store_kind
from ._store import DestinationStats, RedeliveryPolicy, Store, now_ms, queue_box

__all__ = ["Broker", "Connection"]

log = logging.getLogger("broker_core")

_POLICY_OPTIONS = {field.name for field in dataclasses.fields(RedeliveryPolicy)}


def _open_store(url: str, options: dict[str, Any]) -> Store:
    if store_kind(url) == "memory":
        from ._memory import MemoryStore

        return MemoryStore(url, **options)
    try:
        from ._sql import SQLStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InvalidArgumentError(f"the SQL store is not available: {exc}") from exc
    return SQLStore(url, **options)


class Broker:
    """A JMS-style broker over one store.

    Open it with :meth:`open`; connect clients with :meth:`connect`. The
    introspection methods (:meth:`destinations`, :meth:`browse`,
    :meth:`replay_dead_letters`) serve operators and the command line.
    """

    def __init__(self, store: Store, policy: RedeliveryPolicy, *, xpath_namespaces: dict[str, str] | None = None,
                 sweep_interval: float = 30.0, selector_string_numbers: str = "convert") -> None:
        if selector_string_numbers not in ("strict", "convert"):
            raise InvalidArgumentError(
                f"selector_string_numbers must be 'strict' or 'convert', not {selector_string_numbers!r}")
        self.store = store
        self.policy = policy
        self.xpath_namespaces = dict(xpath_namespaces or {})
        #: how selectors read the string properties of messages from text protocols (STOMP): a
        #: listener given no choice of its own marks its messages so (see STRING_NUMBERS_PROPERTY)
        self.selector_string_numbers = selector_string_numbers
        self.instance_id = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._consumers: collections.Counter[str] = collections.Counter()
        self._active_durables: set[str] = set()
        self._client_ids: set[str] = set()
        self._temporaries: dict[Destination, "Connection"] = {}
        self._connections: set[Connection] = set()
        self._closed = False
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()
        store.attach(policy, self._wake, self.xpath_namespaces or None)
        if sweep_interval > 0:
            self._sweeper = threading.Thread(
                target=self._sweep_loop, args=(sweep_interval,), name="broker-sweeper", daemon=True
            )
            self._sweeper.start()

    @classmethod
    def open(cls, url: str = "memory://", **options: Any) -> "Broker":
        """Open a broker on the store named by ``url``.

        Redelivery options (see :class:`RedeliveryPolicy` for defaults):
        ``max_deliveries``, ``redelivery_delay`` (s), ``redelivery_backoff``,
        ``max_redelivery_delay`` (s), ``dead_letter_prefix``, ``expiry_queue``.
        ``xpath_namespaces`` maps prefixes for ``XPATH`` selectors;
        ``sweep_interval`` (s, default 30, 0 to disable) is how often expired
        messages are swept. ``selector_string_numbers`` (``convert``, the
        default, or ``strict``): whether selectors read the string properties
        of messages sent over STOMP (every header is a string there) as
        numbers where they want one, as ActiveMQ does, or keep the JMS rule
        (a string never compares with a number); a STOMP listener's own
        option overrides it. Other options go to the store.
        """
        options = check_options(url, options)
        policy = RedeliveryPolicy(**{k: options.pop(k) for k in list(options) if k in _POLICY_OPTIONS})
        xpath_namespaces = options.pop("xpath_namespaces", None)
        sweep_interval = options.pop("sweep_interval", 30.0)
        string_numbers = options.pop("selector_string_numbers", "CONVERT").lower()
        store = _open_store(url, options)
        return cls(store, policy, xpath_namespaces=xpath_namespaces, sweep_interval=sweep_interval,
                   selector_string_numbers=string_numbers)

    @staticmethod
    def check_options(url: str, **options: Any) -> None:
        """Check what :meth:`open` would be given, opening nothing: the URL's
        scheme, every option's name and value. Raises
        :class:`InvalidArgumentError` (its ``option`` names the one at fault)."""
        check_options(url, options)

    def __enter__(self) -> "Broker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Broker":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        from ._session import _close_off_loop

        await _close_off_loop(self.store, self.close)

    def connect(self, client_id: str | None = None, user: str | None = None) -> "Connection":
        """A new, stopped connection. ``client_id`` (needed for durable
        subscriptions) must be unique among open connections; ``user``, when
        given, is stamped on every sent message as ``JMSXUserID``."""
        self._check_open()
        return Connection(self, client_id, user)

    def close(self) -> None:
        """Close every connection and the store."""
        if self._closed:
            return
        for conn in list(self._connections):
            conn.close()
        self._closed = True
        self._sweep_stop.set()
        self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the broker is closed")

    # ------------------------------------------------------------ internals

    def _new_message_id(self) -> str:
        return f"ID:{self.instance_id}-{next(self._ids)}"

    def _wake(self, box: str) -> None:
        """Wake consumers of ``box`` (``"*"``: of every box)."""
        if box == "*":
            for wakers in list(self._wakers.values()):
                for wake in tuple(wakers):
                    wake()
            return
        wakers = self._wakers.get(box)
        if wakers:
            for wake in tuple(wakers):
                wake()

    def _add_waker(self, box: str, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.setdefault(box, []).append(wake)

    def _remove_waker(self, box: str, wake: Callable[[], None]) -> None:
        with self._lock:
            wakers = self._wakers.get(box)
            if wakers and wake in wakers:
                wakers.remove(wake)
                if not wakers:
                    del self._wakers[box]

    def _sweep_loop(self, interval: float) -> None:
        while not self._sweep_stop.wait(interval):
            try:
                self.sweep_expired()
            except Exception:  # keep sweeping; report it
                log.exception("sweeping expired messages failed")

    # ------------------------------------------------------------ introspection

    def sweep_expired(self) -> int:
        """Remove expired messages now; returns how many."""
        return self.store.sweep_expired(now_ms())

    def destinations(self) -> list[DestinationStats]:
        """Counters of every queue and subscription, sorted by name."""
        stats = self.store.stats()
        counts = self._consumers
        out = [
            DestinationStats(**{**s.__dict__, "consumers": counts.get(s.name, 0)})
            for s in stats
        ]
        return sorted(out, key=lambda s: s.name)

    def stats(self, destination: Destination | str) -> DestinationStats:
        """Counters of one queue or subscription box."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        for s in self.destinations():
            if s.name == key:
                return s
        return DestinationStats(key, 0, 0, self._consumers.get(key, 0), 0, 0, 0, 0)

    def browse(self, destination: Destination | str, selector: str | None = None,
               limit: int | None = None) -> Iterator[Message]:
        """Read-only messages waiting in a queue (or subscription box), in
        delivery order, without consuming them."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        for n, env in enumerate(self.store.browse(key, selector)):
            if limit is not None and n >= limit:
                return
            yield message_from_envelope(env, 0)

    def message_status(self, message_ids: list[str]) -> dict[str, str]:
        """Where each message stands: ``"pending"`` (waiting in a queue or
        subscription), ``"in_flight"`` (delivered, not yet acknowledged),
        ``"dead_lettered"`` (in a dead-letter queue), ``"expired"`` (its time
        to live ran out before anyone consumed it; remembered for
        ``expired_retention`` seconds on the SQL store, the last 100,000 on the
        memory store) or ``"gone"`` (consumed and acknowledged, or never
        stored)."""
        found = self.store.locate(message_ids)
        dlq = f"queue://{self.policy.dead_letter_prefix}"
        out = {}
        for message_id in message_ids:
            where = found.get(message_id)
            if where is None:
                out[message_id] = "gone"
            elif where[1] == "expired":
                out[message_id] = "expired"
            elif where[0].startswith(dlq):
                out[message_id] = "dead_lettered"
            else:
                out[message_id] = where[1]
        return out

    def replay_dead_letters(self, dead_letter_queue: Queue | str, limit: int | None = None) -> int:
        """Move messages from a dead-letter queue back to their original
        destination (``JMS_DLQ_OriginalDestination``) with a fresh delivery
        count; returns how many moved. Messages whose original destination is
        unknown stay where they are."""
        queue = dead_letter_queue if isinstance(dead_letter_queue, Queue) else Queue(str(dead_letter_queue))
        reader = self.store.reader(queue_box(queue), None)
        moved = 0
        skipped = []
        try:
            while limit is None or moved < limit:
                delivery = reader.claim(now_ms(), False)
                if delivery is None:
                    break
                env = delivery.envelope
                origin = env.properties.get("JMS_DLQ_OriginalDestination")
                try:
                    target = parse_destination(origin) if isinstance(origin, str) else None
                except InvalidDestinationError:
                    target = None
                if target is None or target.is_temporary:
                    skipped.append(delivery)
                    continue
                properties = {k: v for k, v in env.properties.items() if not k.startswith("JMS_DLQ_")}
                self.store.commit([env.replace(destination=target, properties=properties)], [delivery])
                moved += 1
        finally:
            if skipped:
                self.store.release(skipped, "not replayable: original destination unknown")
            reader.close()
        return moved


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

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Connection":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        from ._session import _close_off_loop

        await _close_off_loop(self._broker.store, self.close)

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

    def create_session(self, transacted: bool = False, ack_mode: AckMode = AckMode.AUTO) -> Any:
        """A session: transacted (its ack mode is then ignored) or not."""
        from ._session import Session

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

