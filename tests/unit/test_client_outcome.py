"""The SDK's classification of failed requests (client/outcome.py): transport error x phase of the
request -> error class, HTTP answers -> refused or maybe applied, and the producer's rule that a
send which may have reached a broker is never reported as "nothing reached the server". The
phases are also driven for real: sockets that refuse, drop a written request, reset, stall."""

from __future__ import annotations

import asyncio
import socket
import struct

import httpx
import pytest

from client.errors import (
    BadRequestError,
    BrokerUnreachableError,
    DiskFullError,
    ForbiddenError,
    LedgerMQError,
    NotMasterError,
    OutcomeUnknownError,
    SendOutcomeUnknownError,
    ServerError,
    ServiceUnavailableError,
    TopicNotExistError,
    UnauthorizedError,
    error_from_problem,
)
from client.outcome import (
    ERROR_FOR_PHASE,
    Delivery,
    RequestPhase,
    delivery_of,
    delivery_of_answer,
    phase_of,
    transport_error,
)
from client.producer import AsyncProducer, Message
from client.transport import AsyncTransport
from tests.ports import free_port

# (httpx error, phase it is raised in, SDK error class, delivery)
TRANSPORT_TABLE = [
    (httpx.ConnectError, RequestPhase.CONNECT, BrokerUnreachableError, Delivery.NOT_SENT),
    (httpx.ConnectTimeout, RequestPhase.CONNECT, BrokerUnreachableError, Delivery.NOT_SENT),
    (httpx.PoolTimeout, RequestPhase.CONNECT, BrokerUnreachableError, Delivery.NOT_SENT),
    (httpx.UnsupportedProtocol, RequestPhase.CONNECT, BrokerUnreachableError, Delivery.NOT_SENT),
    (httpx.WriteError, RequestPhase.SEND, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.WriteTimeout, RequestPhase.SEND, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.LocalProtocolError, RequestPhase.SEND, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.ReadError, RequestPhase.AWAIT, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.ReadTimeout, RequestPhase.AWAIT, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.RemoteProtocolError, RequestPhase.AWAIT, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.CloseError, RequestPhase.AWAIT, OutcomeUnknownError, Delivery.MAYBE),
    (httpx.ProxyError, RequestPhase.AWAIT, OutcomeUnknownError, Delivery.MAYBE),
]


@pytest.mark.parametrize(("exc_type", "phase", "error_cls", "delivery"), TRANSPORT_TABLE)
def test_transport_error_by_phase(exc_type, phase, error_cls, delivery):
    exc = exc_type("boom")
    assert phase_of(exc) is phase
    err = transport_error(exc, "POST http://b/topics/t/messages")
    assert type(err) is error_cls
    assert ERROR_FOR_PHASE[phase] is error_cls
    assert delivery_of(err) is delivery
    assert err.retryable


def test_every_httpx_transport_error_has_a_phase_and_unlisted_ones_count_as_maybe():
    def leaves(cls):
        subs = cls.__subclasses__()
        return [cls] if not subs else [c for s in subs for c in leaves(s)]

    listed = {row[0] for row in TRANSPORT_TABLE}
    assert set(leaves(httpx.TransportError)) <= listed, "a new httpx transport error needs a row"

    class NewTransportError(httpx.TransportError):
        pass

    assert delivery_of(transport_error(NewTransportError("x"), "GET u")) is Delivery.MAYBE


# (status, code, problem extras, SDK error class, delivery)
ANSWER_TABLE = [
    (400, "INVALID_REQUEST", {"field": "messages[0].body"}, BadRequestError, Delivery.REFUSED),
    (401, "UNAUTHORIZED", {}, UnauthorizedError, Delivery.REFUSED),
    (403, "NO_PERMISSION", {}, ForbiddenError, Delivery.REFUSED),
    (404, "TOPIC_NOT_EXIST", {}, TopicNotExistError, Delivery.REFUSED),
    (413, "MESSAGE_TOO_LARGE", {"limit": 10}, BadRequestError, Delivery.REFUSED),
    (421, "NOT_MASTER", {"masterAddr": "h:1"}, NotMasterError, Delivery.REFUSED),
    (507, "DISK_FULL", {}, DiskFullError, Delivery.REFUSED),
    (500, "INTERNAL_ERROR", {}, ServerError, Delivery.MAYBE),
    (502, None, {}, ServerError, Delivery.MAYBE),
    (503, "SERVICE_UNAVAILABLE", {}, ServiceUnavailableError, Delivery.MAYBE),
    (503, "SERVICE_UNAVAILABLE", {"outcome": "refused"}, ServiceUnavailableError, Delivery.REFUSED),
    (504, "TIMEOUT", {"outcome": "unknown"}, OutcomeUnknownError, Delivery.MAYBE),
]


@pytest.mark.parametrize(("status", "code", "extra", "error_cls", "delivery"), ANSWER_TABLE)
def test_answer_classification(status, code, extra, error_cls, delivery):
    problem = {"code": code, "detail": "d", **extra} if code else {}
    err = error_from_problem(status, problem)
    assert isinstance(err, error_cls)
    assert delivery_of_answer(status, problem) is delivery
    assert delivery_of(err) is delivery


def test_a_success_whose_body_cannot_be_read_may_have_stored_the_message():
    assert delivery_of(ServerError("answer is not valid JSON", status=200)) is Delivery.MAYBE


def test_errors_raised_before_any_request_are_not_sent():
    assert delivery_of(NotMasterError("broker set b has no master in the route")) is Delivery.NOT_SENT
    assert delivery_of(TopicNotExistError("no writable broker set")) is Delivery.NOT_SENT
    assert delivery_of(LedgerMQError("no name server configured")) is Delivery.NOT_SENT


def test_send_outcome_unknown_keeps_the_keys_and_the_set_and_is_an_outcome_unknown_error():
    cause = BrokerUnreachableError("connection refused")
    msgs = [Message(b"a", idempotency_key="k1", queue_id=0), Message(b"b", idempotency_key="k2", queue_id=0)]
    err = SendOutcomeUnknownError("x", topic="t", broker_name="broker-a", messages=msgs, cause=cause)
    assert isinstance(err, OutcomeUnknownError) and err.retryable
    assert not isinstance(err, BrokerUnreachableError)
    assert (err.topic, err.broker_name, err.idempotency_key, err.idempotency_keys) == (
        "t",
        "broker-a",
        "k1",
        ["k1", "k2"],
    )
    assert err.cause is cause and delivery_of(err) is Delivery.MAYBE


# ---- the phases on real sockets ------------------------------------------------------------------


class _Server:
    """A TCP server whose connections do `behaviour(reader, writer)`; counts requests fully read."""

    def __init__(self, behaviour) -> None:
        self.behaviour = behaviour
        self.requests_read = 0
        self.read_one = asyncio.Event()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def read_request(self, reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
        await reader.readexactly(length)
        self.requests_read += 1
        self.read_one.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self.behaviour(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


async def _close_after_reading(srv: _Server, reader, writer) -> None:
    await srv.read_request(reader)


async def _reset_after_reading(srv: _Server, reader, writer) -> None:
    await srv.read_request(reader)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _stall_after_reading(srv: _Server, reader, writer) -> None:
    await srv.read_request(reader)
    await asyncio.sleep(5)


async def _never_read(srv: _Server, reader, writer) -> None:
    await asyncio.sleep(5)


async def _post(url: str, body: bytes, timeout_s: float = 2.0):
    t = AsyncTransport(timeout_s=timeout_s)
    try:
        return await t.request("POST", url + "/topics/t/messages", content=body)
    finally:
        await t.aclose()


async def test_connection_refused_is_unreachable():
    with pytest.raises(BrokerUnreachableError) as info:
        await _post(f"http://127.0.0.1:{free_port()}", b"{}")
    assert delivery_of(info.value) is Delivery.NOT_SENT


@pytest.mark.parametrize("behaviour", [_close_after_reading, _reset_after_reading, _stall_after_reading])
async def test_a_request_the_server_read_and_never_answered_is_outcome_unknown(behaviour):
    srv = _Server(behaviour)
    async with srv as url:
        with pytest.raises(OutcomeUnknownError) as info:
            await _post(url, b'{"messages": []}', timeout_s=0.5)
    assert srv.requests_read == 1, "the server did read the request"
    assert not isinstance(info.value, BrokerUnreachableError)
    assert delivery_of(info.value) is Delivery.MAYBE


async def test_a_request_stuck_while_written_is_outcome_unknown():
    srv = _Server(_never_read)
    async with srv as url:
        with pytest.raises(OutcomeUnknownError) as info:
            await _post(url, b"x" * (64 << 20), timeout_s=0.3)
    assert "phase send" in str(info.value)
    assert delivery_of(info.value) is Delivery.MAYBE


async def test_producer_reports_a_send_that_reached_a_server_then_found_it_gone_as_outcome_unknown():
    """The race of the issue: the first attempt is read by the broker and gets no answer; by the
    retry the broker is gone (connection refused). The send must not end as 'unreachable'."""

    async def read_then_vanish(srv: _Server, reader, writer) -> None:
        await srv.read_request(reader)
        srv.server.close()  # the listening socket goes: every retry is refused

    srv = _Server(read_then_vanish)
    async with srv as url:
        async with AsyncProducer(broker_addr=url, send_timeout_s=0.6, request_timeout_s=0.3) as p:
            with pytest.raises(SendOutcomeUnknownError) as info:
                await p.send("t", b"m", queue_id=0)
            assert p.retries >= 1
    err = info.value
    assert srv.requests_read == 1
    assert isinstance(err.cause, BrokerUnreachableError), "later attempts were refused"
    assert err.broker_name == url and err.topic == "t"
    assert len(err.idempotency_key) == 32 and err.messages[0].queue_id == 0
    assert err.messages[0].body == b"m"


async def test_producer_reports_a_send_that_never_reached_a_server_as_unreachable():
    async with AsyncProducer(broker_addr=f"127.0.0.1:{free_port()}", send_timeout_s=0.3) as p:
        with pytest.raises(BrokerUnreachableError):
            await p.send_batch("t", [b"a", b"b"])
        assert p.retries >= 1


async def test_a_send_in_flight_when_close_gives_up_fails_as_outcome_unknown_not_left_pending():
    srv = _Server(_stall_after_reading)
    async with srv as url:
        p = AsyncProducer(broker_addr=url, send_timeout_s=30, request_timeout_s=30)
        fut = await p.send_async("t", b"m", queue_id=0)
        await asyncio.wait_for(srv.read_one.wait(), 10)
        await p.close(timeout_s=0.2)
        assert fut.done()
        with pytest.raises(SendOutcomeUnknownError) as info:
            fut.result()
    assert info.value.broker_name == url
    assert "cut off by the producer's close" in str(info.value)
