"""`DeadLetterService`: send messages a group gave up on (`%DLQ%{group}`) back to their topic.

A message goes to `%DLQ%{group}` after `maxReconsumeTimes` redeliveries (`PopService`), with
ORIGIN_MESSAGE_ID, RETRY_TOPIC and RECONSUME_TIME among its properties. Resending stores a copy
in RETRY_TOPIC (body, tags, keys and the user's properties; RESEND_FROM_DLQ names the dead
letter), so the group receives it again as a new message — as do the other groups of that topic,
as with rocketmq-dashboard's resend to the original topic. A repeated resend of the same dead
letter within `idempotencyWindowMs` answers the first copy instead of storing another (an
operator's double click). Callers: the front-ends (`POST /consumers/{group}/dlq/resend`, console).
"""

from __future__ import annotations

from typing import NamedTuple

from broker.errors import BrokerCode, BrokerError
from broker.message import Message
from broker.service.acl import AccessControl, Account, Right
from broker.service.pop import DLQ_PREFIX
from broker.service.produce import ProduceService
from broker.service.query import MessageQueryService
from broker.service.state import BrokerState

# Properties the DLQ write adds; the resent copy carries the dead letter's id instead.
_DLQ_PROPERTIES = ("ORIGIN_MESSAGE_ID", "RETRY_TOPIC", "RECONSUME_TIME")
RESEND_FROM_DLQ = "RESEND_FROM_DLQ"


class ResendResult(NamedTuple):
    """Where the copy of dead letter `msg_id` was stored."""

    msg_id: str
    new_msg_id: str
    topic: str
    queue_id: int
    queue_offset: int


class DeadLetterService:
    """Dead letters of one broker set."""

    def __init__(
        self, state: BrokerState, acl: AccessControl, produce: ProduceService, query: MessageQueryService
    ) -> None:
        self.state = state
        self.acl = acl
        self.produce = produce
        self.query = query

    async def resend(self, account: Account, group: str, msg_ids: list[str]) -> list[ResendResult]:
        """Store a copy of each dead letter of `group` in its original topic, in order; the caller
        needs SUB on the group and PUB on each original topic (an admin anything). The first
        failure is raised; the dead letters before it were resent (resending them again answers
        the same copies)."""
        self.acl.authorize(account, group=group, right=Right.SUB)
        self.state.require_master()
        dlq = DLQ_PREFIX + group
        out = []
        for i, msg_id in enumerate(msg_ids):
            dead = self.query.lookup(msg_id)
            origin = dead.properties.get("RETRY_TOPIC")
            if dead.topic != dlq or not origin:
                raise BrokerError(
                    BrokerCode.INVALID_REQUEST,
                    f"msgIds[{i}]: {msg_id} is in {dead.topic!r}, not a dead letter of group {group!r}",
                    field=f"msgIds[{i}]",
                )
            self.acl.authorize(account, topic=origin, right=Right.PUB)
            props = {k: v for k, v in dead.user_properties.items() if k not in _DLQ_PROPERTIES}
            props[RESEND_FROM_DLQ] = dead.msg_id
            copy = Message(
                topic=origin,
                body=dead.body,
                tags=dead.tags,
                keys=dead.keys,
                properties=props,
                idempotency_key=f"dlq-resend.{dead.msg_id}",
                born_timestamp=dead.born_timestamp,
                born_host=dead.born_host,
            )
            (put,) = await self.produce.put(origin, [copy], [None])
            out.append(ResendResult(dead.msg_id, put.msg_id, origin, put.queue_id, put.queue_offset))
        return out
