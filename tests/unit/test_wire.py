"""The shared wire vocabulary: one code table that every side reads the same way — the broker's
BrokerError, the name server's problem bodies and the SDK's exception classes."""

from __future__ import annotations

import pytest

from broker.errors import BrokerCode, BrokerError, from_dledger
from client.errors import (
    BadRequestError,
    DiskFullError,
    ForbiddenError,
    NotFoundError,
    NotMasterError,
    OutcomeUnknownError,
    ServerError,
    ServiceUnavailableError,
    error_from_problem,
)
from dledger.codes import DLedgerException, DLedgerResponseCode
from wire.codes import ErrorCode
from wire.msgid import MessageIdError, create_message_id, decode_message_id
from wire.problem import PROBLEM_TYPE_BASE, problem_body


def test_every_code_has_an_error_status_and_a_title() -> None:
    for code in ErrorCode:
        assert 400 <= code.status < 600 and code.title and code.value == code.name
    assert BrokerCode is ErrorCode


def test_problem_body_is_the_same_from_broker_and_table() -> None:
    body = problem_body(ErrorCode.NOT_MASTER, "slave", masterAddr="h:1", field=None)
    assert body == {
        "type": PROBLEM_TYPE_BASE + "NOT_MASTER",
        "title": ErrorCode.NOT_MASTER.title,
        "status": 421,
        "detail": "slave",
        "code": "NOT_MASTER",
        "masterAddr": "h:1",
    }
    assert BrokerError(BrokerCode.NOT_MASTER, "slave", masterAddr="h:1").problem() == body


@pytest.mark.parametrize("code", list(ErrorCode))
def test_the_sdk_maps_every_code_to_an_exception_of_its_status(code: ErrorCode) -> None:
    err = error_from_problem(code.status, problem_body(code, "x"))
    assert err.status == code.status and err.problem["code"] == code.value
    if 400 <= code.status < 500 and code.status not in (401, 403, 404, 421):
        assert isinstance(err, BadRequestError)
    elif code.status >= 500:
        assert isinstance(err, ServerError)


@pytest.mark.parametrize(
    "status,cls",
    [
        (421, NotMasterError),
        (404, NotFoundError),
        (403, ForbiddenError),
        (503, ServiceUnavailableError),
        (504, OutcomeUnknownError),
        (507, DiskFullError),
        (405, BadRequestError),
        (502, ServerError),
    ],
)
def test_an_answer_without_our_code_maps_by_status(status: int, cls: type) -> None:
    assert type(error_from_problem(status, "gateway said no")) is cls


def test_message_ids_round_trip_and_refuse_what_is_no_id() -> None:
    mid = create_message_id("10.1.2.3:10911", 2**40 + 5)
    assert len(mid) == 32 and decode_message_id(mid) == ("10.1.2.3:10911", 2**40 + 5)
    for bad in ("", "zz", mid[:-1], mid + "00"):
        with pytest.raises(MessageIdError):
            decode_message_id(bad)


@pytest.mark.parametrize(
    "dcode,code,outcome",
    [
        (DLedgerResponseCode.NOT_LEADER, BrokerCode.NOT_MASTER, None),
        (DLedgerResponseCode.LEADER_TRANSFERRING, BrokerCode.NOT_MASTER, None),
        (DLedgerResponseCode.LEADER_NOT_READY, BrokerCode.SERVICE_UNAVAILABLE, "refused"),
        (DLedgerResponseCode.LEADER_PENDING_FULL, BrokerCode.SERVICE_UNAVAILABLE, "refused"),
        (DLedgerResponseCode.DISK_FULL, BrokerCode.DISK_FULL, None),
        (DLedgerResponseCode.WAIT_QUORUM_ACK_TIMEOUT, BrokerCode.TIMEOUT, "unknown"),
        (DLedgerResponseCode.NETWORK_ERROR, BrokerCode.TIMEOUT, "unknown"),
        (DLedgerResponseCode.TERM_CHANGED, BrokerCode.TIMEOUT, "unknown"),
        (DLedgerResponseCode.INDEX_OUT_OF_RANGE, BrokerCode.INTERNAL_ERROR, None),
    ],
)
def test_one_dledger_mapping(dcode: DLedgerResponseCode, code: BrokerCode, outcome: str | None) -> None:
    err = from_dledger(DLedgerException(dcode, "x"))
    assert err.code == code and err.extra.get("outcome") == outcome


def test_not_master_from_dledger_names_the_master_the_store_knows() -> None:
    def not_master() -> BrokerError:
        return BrokerError(BrokerCode.NOT_MASTER, "a slave", masterAddr="m:1")

    err = from_dledger(DLedgerException(DLedgerResponseCode.NOT_LEADER), not_master)
    assert err.extra["masterAddr"] == "m:1" and "NOT_LEADER" in err.detail
