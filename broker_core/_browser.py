"""Queue browsers: the messages waiting in a queue, without consuming them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ._destinations import Queue
from ._errors import IllegalStateError
from ._message import Message, message_from_envelope
from ._store import queue_box

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["QueueBrowser"]


class QueueBrowser:
    """Iterate (``for m in browser``) over the messages waiting in a queue, in
    delivery order, without consuming them; each iteration takes a fresh look."""

    def __init__(self, session: Session, queue: Queue, selector: str | None) -> None:
        self._session = session
        self.queue = queue
        self.message_selector = selector
        self._closed = False

    def __iter__(self) -> Iterator[Message]:
        if self._closed:
            raise IllegalStateError("the browser is closed")
        self._session._check_open()
        for env in self._session._store.browse(queue_box(self.queue), self.message_selector):
            yield message_from_envelope(env, 0)

    def close(self) -> None:
        self._closed = True
        if self in self._session._browsers:
            self._session._browsers.remove(self)

    def __enter__(self) -> QueueBrowser:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
