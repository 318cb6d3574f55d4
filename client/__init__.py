"""LedgerMQ Python SDK (httpx, sync and async): Producer, PullConsumer, SimpleConsumer, Admin."""

from client.admin import Admin, AsyncAdmin
from client.consumer import (
    AsyncPullConsumer,
    AsyncSimpleConsumer,
    MessageQueue,
    PullConsumer,
    PullResult,
    ReceivedMessage,
    SimpleConsumer,
)
from client.errors import LedgerMQError
from client.producer import AsyncProducer, Message, Producer, SendResult

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncSimpleConsumer",
    "LedgerMQError",
    "Message",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "ReceivedMessage",
    "SendResult",
    "SimpleConsumer",
]
