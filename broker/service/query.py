"""`MessageQueryService`: look a stored message up by its id (store host + physical offset)."""

from __future__ import annotations

from broker.errors import BrokerCode, BrokerError
from broker.message import MessageExt, decode_message_id
from broker.service.acl import AccessControl, Account, Right
from broker.service.state import BrokerState
from broker.topics import is_system_topic


class MessageQueryService:
    """Message queries for one broker. Callers: the front-ends (`GET /messages/{id}`, console)."""

    def __init__(self, state: BrokerState, acl: AccessControl) -> None:
        self.store = state.store
        self.acl = acl

    def by_id(self, account: Account, msg_id: str) -> MessageExt:
        """The message `msg_id` names, for a caller with SUB on its topic; MESSAGE_NOT_FOUND when
        no message of this store starts there (or it is another store host's id)."""
        _, phys = decode_message_id(msg_id)
        try:
            msg = self.store.look_message_by_offset(phys)
        except BrokerError as exc:
            if exc.code in (BrokerCode.MESSAGE_CORRUPTED, BrokerCode.INTERNAL_ERROR):
                raise
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id} ({exc.detail})") from None
        except Exception as exc:  # a position that is not a message start must be a 404, not a 500
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}: {exc}") from None
        # The id names its store host too: a message of another broker that happens to start at
        # the same offset here is not the one asked for.
        if msg is None or is_system_topic(msg.topic) or msg.msg_id != msg_id.upper():
            raise BrokerError(BrokerCode.MESSAGE_NOT_FOUND, f"no message {msg_id}")
        self.acl.authorize(account, topic=msg.topic, right=Right.SUB)
        return msg
