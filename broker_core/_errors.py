"""The one error hierarchy of the broker, named as in ``javax.jms``::

JMSError
├── IllegalStateError            (also RuntimeError)
│   ├── TransactionInProgressError
│   └── LeaseExpiredError
├── InvalidClientIDError
├── InvalidDestinationError
├── InvalidSelectorError         (also ValueError)
├── InvalidArgumentError         (also ValueError)
├── MessageFormatError           (also TypeError)
│   └── InvalidPropertyError     (also ValueError)
├── MessageNotReadableError
├── MessageNotWriteableError
├── MessageEOFError
├── TransactionRolledBackError
├── JMSSecurityError
├── ResourceAllocationError
├── RequestTimeoutError          (also TimeoutError)
└── StoreError
    └── StoreUnavailableError    (retryable)
"""

from __future__ import annotations

__all__ = [
    "JMSError",
    "IllegalStateError",
    "TransactionInProgressError",
    "LeaseExpiredError",
    "InvalidClientIDError",
    "InvalidDestinationError",
    "InvalidSelectorError",
    "InvalidArgumentError",
    "MessageFormatError",
    "InvalidPropertyError",
    "MessageNotReadableError",
    "MessageNotWriteableError",
    "MessageEOFError",
    "TransactionRolledBackError",
    "JMSSecurityError",
    "ResourceAllocationError",
    "RequestTimeoutError",
    "StoreError",
    "StoreUnavailableError",
]


class JMSError(Exception):
    """Base of every error raised by the broker."""


class IllegalStateError(JMSError, RuntimeError):
    """Raised when a method is called at a time it is not allowed: on a closed
    connection, session, producer, consumer or browser; ``commit()`` on a
    non-transacted session; deleting a temporary destination that still has
    consumers; a second active consumer on one durable subscription."""


class TransactionInProgressError(IllegalStateError):
    """Raised when an operation is not allowed while a transaction is open."""


class LeaseExpiredError(IllegalStateError):
    """Raised by ``acknowledge()`` when some of the messages being
    acknowledged were taken back from this consumer because its process was
    presumed dead (no heartbeat within the store's ``lease_timeout``). Those
    messages are redelivered (marked redelivered); the others are acknowledged."""


class InvalidClientIDError(JMSError):
    """Raised when a client id is empty or already in use by another open
    connection of the same broker."""


class InvalidDestinationError(JMSError):
    """Raised when a destination is not usable: a malformed name, a deleted
    temporary destination, a temporary destination consumed from another
    connection, or an unknown durable subscription name."""


class InvalidSelectorError(JMSError, ValueError):
    """Raised when a message selector does not parse or is ill-typed.

    ``line`` and ``column`` give the position of the problem (1-based), and
    the message quotes the selector with a caret under it.
    """

    def __init__(self, message: str, *, selector: str = "", line: int = 0, column: int = 0):
        super().__init__(message)
        self.selector = selector
        self.line = line
        self.column = column


class InvalidArgumentError(JMSError, ValueError):
    """Raised for an argument out of its allowed range: a priority outside
    0-9, a negative time to live, an unknown delivery or acknowledge mode; or
    by :meth:`Broker.open` and :meth:`Broker.check_options` for an option
    with an unknown name or a wrong value, which ``option`` then names."""

    def __init__(self, *args: object, option: str | None = None) -> None:
        super().__init__(*args)
        #: the :meth:`Broker.open` option at fault, if that is what was wrong
        self.option = option


class MessageFormatError(JMSError, TypeError):
    """Raised when a value cannot be converted to the type asked for, by the
    JMS conversion table (``get_int_property`` on a boolean, say), or when a
    value of an unsupported type is set."""


class InvalidPropertyError(MessageFormatError, ValueError):
    """Raised when a property name breaks the JMS identifier rules (empty, not
    a Java identifier, a selector keyword, a reserved ``JMS`` prefix) or a
    property value is not one of the JMS property types."""


class MessageNotReadableError(JMSError):
    """Raised when a write-only message body is read (a ``BytesMessage`` or
    ``StreamMessage`` being built, before ``reset()``)."""


class MessageNotWriteableError(JMSError):
    """Raised when a read-only message is changed: the body or properties of a
    received message (``clear_body()`` / ``clear_properties()`` make them
    writable again)."""


class MessageEOFError(JMSError):
    """Raised when reading past the end of a ``BytesMessage`` or
    ``StreamMessage`` body."""


class TransactionRolledBackError(JMSError):
    """Raised by ``commit()`` when the transaction could not be committed and
    was rolled back instead."""


class JMSSecurityError(JMSError):
    """Raised when a user or client is not allowed to connect or act."""


class ResourceAllocationError(JMSError):
    """Raised when the broker cannot allocate what a call needs (a limit on
    connections, consumers or memory is reached)."""


class RequestTimeoutError(JMSError, TimeoutError):
    """Raised by ``Requestor.request`` when no reply arrived in time."""


class StoreError(JMSError):
    """Raised when the message store fails in a way that is not the caller's
    fault."""


class StoreUnavailableError(StoreError):
    """Raised when the store cannot be reached (database restarting, network
    down). Retryable: nothing of the failed call took effect."""
