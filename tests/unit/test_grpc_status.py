"""The gRPC endpoint's statuses and caller identity: every broker error has a rocketmq-apis code
(never 0), and RocketMQ 5's access-key signature is checked against the ACL's accounts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rocketmq.v5.util.signature import Signature

from broker.errors import BrokerCode, BrokerError
from broker.grpc import auth
from broker.grpc.protocol import Code
from broker.grpc.status import CODE_TABLE, code_for, error_status
from broker.service.acl import ANONYMOUS, AccessControl, Account, Right


def test_every_broker_code_has_a_nonzero_grpc_code() -> None:
    assert set(CODE_TABLE) == set(BrokerCode)
    assert Code.CODE_UNSPECIFIED not in CODE_TABLE.values()
    # MESSAGE_NOT_FOUND reads as "nothing to receive" (success) to the clients: no error maps to it.
    assert Code.MESSAGE_NOT_FOUND not in CODE_TABLE.values()


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (
            BrokerError(BrokerCode.INVALID_REQUEST, "x", field="receiptHandles[3]"),
            Code.INVALID_RECEIPT_HANDLE,
        ),
        (
            BrokerError(BrokerCode.INVALID_REQUEST, "x", field="messages[0].messageId"),
            Code.ILLEGAL_MESSAGE_ID,
        ),
        (BrokerError(BrokerCode.INVALID_REQUEST, "x", field="messages[1].body"), Code.BAD_REQUEST),
        (BrokerError(BrokerCode.INVALID_REQUEST, "x", field="longPollingTimeout"), Code.ILLEGAL_POLLING_TIME),
        (BrokerError(BrokerCode.INVALID_REQUEST, "x", field="waitMs"), Code.ILLEGAL_POLLING_TIME),
        (BrokerError(BrokerCode.INVALID_REQUEST, "x"), Code.BAD_REQUEST),
        (BrokerError(BrokerCode.TOPIC_NOT_EXIST, "x"), Code.TOPIC_NOT_FOUND),
        (BrokerError(BrokerCode.MESSAGE_TOO_LARGE, "x"), Code.MESSAGE_BODY_TOO_LARGE),
        (BrokerError(BrokerCode.FORBIDDEN, "x"), Code.FORBIDDEN),
        (BrokerError(BrokerCode.MESSAGE_NOT_FOUND, "gone"), Code.INVALID_RECEIPT_HANDLE),
    ],
)
def test_code_for(exc: BrokerError, code: int) -> None:
    assert code_for(exc) == code


def test_error_status_carries_the_detail() -> None:
    st = error_status(BrokerError(BrokerCode.INVALID_TOPIC, "topic 'a b' has a space"))
    assert (st.code, st.message) == (Code.ILLEGAL_TOPIC, "topic 'a b' has a space")


def _signed(ak: str, sk: str) -> dict[str, str]:
    config = SimpleNamespace(credentials=SimpleNamespace(ak=ak, sk=sk), namespace="")
    return dict(Signature.metadata(config, "host@1@0@x"))  # what the official client sends


ACL = AccessControl(
    [
        Account("orders-app", "s3cret", topic_perms={"orders": Right.PUB}),
        Account("admin", "root-token", admin=True),
    ]
)


def test_signature_of_the_official_client_authenticates_its_account() -> None:
    assert auth.authenticate(ACL, _signed("orders-app", "s3cret")).name == "orders-app"
    assert auth.authenticate(ACL, _signed("admin", "root-token")).admin


@pytest.mark.parametrize(
    "meta",
    [
        _signed("orders-app", "wrong"),
        _signed("nobody", "s3cret"),
        _signed("", ""),  # the client sends an empty credential when none is configured
        {},
        {"authorization": "Bearer s3cret"},
    ],
)
def test_bad_or_missing_signature_is_unauthorized(meta: dict[str, str]) -> None:
    with pytest.raises(BrokerError) as err:
        auth.authenticate(ACL, meta)
    assert err.value.code == BrokerCode.UNAUTHORIZED


def test_signed_header_must_be_the_date_time() -> None:
    meta = _signed("orders-app", "s3cret")
    meta["authorization"] = meta["authorization"].replace("x-mq-date-time", "x-mq-request-id")
    with pytest.raises(BrokerError):
        auth.authenticate(ACL, meta)


def test_acl_off_is_anonymous() -> None:
    assert auth.authenticate(AccessControl.disabled(), {}) is ANONYMOUS
