"""LedgerMQ Python SDK (sync and async): Producer (batching), PullConsumer (with a prefetching
iterator), SimpleConsumer, PushConsumer, Admin."""

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
from client.push import AsyncPushConsumer, ConsumeResult, PushConsumer
from client.transaction import Transaction, TransactionResolution

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncProducer",
    "AsyncPullConsumer",
    "AsyncPushConsumer",
    "AsyncSimpleConsumer",
    "ConsumeResult",
    "LedgerMQError",
    "Message",
    "MessageQueue",
    "Producer",
    "PullConsumer",
    "PullResult",
    "PushConsumer",
    "ReceivedMessage",
    "SendResult",
    "SimpleConsumer",
    "Transaction",
    "TransactionResolution",
]
