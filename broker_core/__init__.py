"""broker_core: a JMS-style message broker in Python.

Queues, topics, temporary destinations, durable subscriptions, SQL-92 and
XPath selectors, acknowledgement modes, transacted sessions, priority, expiry,
redelivery with dead letters, browsers and request-reply, over a pluggable
store (``memory://``; ``sqlite:///`` and ``postgresql+psycopg://`` with the
SQL store). It imports nothing from the gateway, the routes or the ETL.
"""

from ._broker import Broker
from ._browse import BrowsedMessage, BrowsePage
from ._browser import QueueBrowser
from ._connection import Connection
from ._constants import AckMode, DeliveryMode
from ._consumer import MessageConsumer
from ._destinations import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic, parse_destination
from ._envelope import Byte, Float, Int, Short
from ._errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidClientIDError,
    InvalidDestinationError,
    InvalidPropertyError,
    InvalidSelectorError,
    JMSError,
    JMSSecurityError,
    LeaseExpiredError,
    MessageEOFError,
    MessageFormatError,
    MessageNotReadableError,
    MessageNotWriteableError,
    RequestTimeoutError,
    ResourceAllocationError,
    StoreError,
    StoreUnavailableError,
    TransactionInProgressError,
    TransactionRolledBackError,
)
from ._message import (
    BytesMessage,
    Char,
    MapMessage,
    Message,
    ObjectMessage,
    StreamMessage,
    TextMessage,
    XMLMessage,
)
from ._producer import MessageProducer
from ._requestor import Requestor, reply_correlation_id
from ._selector import STRING_NUMBERS_PROPERTY, string_number
from ._session import Session
from ._store import DestinationStats, RedeliveryPolicy

__all__ = [
    "STRING_NUMBERS_PROPERTY",
    "AckMode",
    "Broker",
    "BrowsePage",
    "BrowsedMessage",
    "Byte",
    "BytesMessage",
    "Char",
    "Connection",
    "DeliveryMode",
    "Destination",
    "DestinationStats",
    "Float",
    "IllegalStateError",
    "Int",
    "InvalidArgumentError",
    "InvalidClientIDError",
    "InvalidDestinationError",
    "InvalidPropertyError",
    "InvalidSelectorError",
    "JMSError",
    "JMSSecurityError",
    "LeaseExpiredError",
    "MapMessage",
    "Message",
    "MessageConsumer",
    "MessageEOFError",
    "MessageFormatError",
    "MessageNotReadableError",
    "MessageNotWriteableError",
    "MessageProducer",
    "ObjectMessage",
    "Queue",
    "QueueBrowser",
    "RedeliveryPolicy",
    "RequestTimeoutError",
    "Requestor",
    "ResourceAllocationError",
    "Session",
    "Short",
    "StoreError",
    "StoreUnavailableError",
    "StreamMessage",
    "TemporaryQueue",
    "TemporaryTopic",
    "TextMessage",
    "Topic",
    "TransactionInProgressError",
    "TransactionRolledBackError",
    "XMLMessage",
    "parse_destination",
    "reply_correlation_id",
    "string_number",
]
