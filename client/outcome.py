"""Whether a failed request may have reached a broker: the SDK's classification table.

A request fails in one of four phases. Which phase decides what the caller may do next:

- `CONNECT` — no connection (refused, reset or timed out while connecting, pool timeout, bad
  URL): no byte of the request left this process, it cannot have taken effect →
  `BrokerUnreachableError`.
- `SEND` — the connection broke or timed out while the request was written: it may have taken
  effect (what the socket had buffered can still arrive whole) → `OutcomeUnknownError`.
- `AWAIT` — the request was written and no answer came (timeout, reset, EOF): it may have taken
  effect → `OutcomeUnknownError`.
- `ANSWERED` — an HTTP status came back: `delivery_of_answer` decides; the error is the typed one
  of `client.errors`.

Answers: every 4xx (including 421 `NOT_MASTER`) and 507 `DISK_FULL` are refusals — the broker
decided before storing anything. Every other 5xx may follow a stored message (504 `TIMEOUT`: the
append was not confirmed in time; 503 is also sent by a member shutting down after a commit; 500
after any step), unless the problem body says `"outcome": "refused"`. A 2xx whose body cannot be
read is a success the SDK could not decode: the message may be stored.

`delivery_of(exc)` reads an SDK error back into one of the three `Delivery` values; the producers
keep, per message, whether any attempt was `MAYBE`, so a later attempt that finds the broker gone
never turns an unknown outcome into "nothing reached the server" (see `SendOutcomeUnknownError`).
"""

from __future__ import annotations

from enum import StrEnum

import httpx

from client.errors import (
    BrokerUnreachableError,
    LedgerMQError,
    OutcomeUnknownError,
)


class RequestPhase(StrEnum):
    """How far a request got before it failed."""

    CONNECT = "connect"
    SEND = "send"
    AWAIT = "await"
    ANSWERED = "answered"


class Delivery(StrEnum):
    """What a failed attempt says about the request's effect on the server."""

    NOT_SENT = "not-sent"  # nothing left this process: the server cannot have applied it
    REFUSED = "refused"  # the server answered that it did not apply it
    MAYBE = "maybe"  # it may have been applied (and a retry may learn the outcome)


# httpx's transport errors by the phase they are raised in (httpcore maps OS errors per step:
# connect, write of the request, read of the answer). A type not listed counts as AWAIT.
HTTPX_PHASE: dict[type[httpx.TransportError], RequestPhase] = {
    httpx.ConnectError: RequestPhase.CONNECT,
    httpx.ConnectTimeout: RequestPhase.CONNECT,
    httpx.PoolTimeout: RequestPhase.CONNECT,
    httpx.UnsupportedProtocol: RequestPhase.CONNECT,
    httpx.WriteError: RequestPhase.SEND,
    httpx.WriteTimeout: RequestPhase.SEND,
    httpx.LocalProtocolError: RequestPhase.SEND,
    httpx.ReadError: RequestPhase.AWAIT,
    httpx.ReadTimeout: RequestPhase.AWAIT,
    httpx.RemoteProtocolError: RequestPhase.AWAIT,
}

# The error a transport failure becomes, by phase.
ERROR_FOR_PHASE: dict[RequestPhase, type[LedgerMQError]] = {
    RequestPhase.CONNECT: BrokerUnreachableError,
    RequestPhase.SEND: OutcomeUnknownError,
    RequestPhase.AWAIT: OutcomeUnknownError,
}


def phase_of(exc: httpx.TransportError) -> RequestPhase:
    """The phase an httpx transport error was raised in (AWAIT when the type does not say)."""
    for cls in type(exc).__mro__:
        phase = HTTPX_PHASE.get(cls)  # type: ignore[arg-type]
        if phase is not None:
            return phase
    return RequestPhase.AWAIT


def transport_error(exc: httpx.TransportError, what: str) -> LedgerMQError:
    """The SDK error for an httpx transport failure of the request described by `what`."""
    phase = phase_of(exc)
    return ERROR_FOR_PHASE[phase](f"{what}: {exc!r} (failed in phase {phase})")


def delivery_of_answer(status: int, problem: dict | None) -> Delivery:
    """What an HTTP error answer says about the request's effect (see the module table)."""
    if 200 <= status < 300:  # a success whose body could not be read
        return Delivery.MAYBE
    if status < 500 or status == 507:
        return Delivery.REFUSED
    if problem and problem.get("outcome") == "refused":
        return Delivery.REFUSED
    return Delivery.MAYBE


def delivery_of(exc: LedgerMQError) -> Delivery:
    """What a failed attempt says about its request's effect. Errors raised before any request
    (no route, no master in the route) have no status and are NOT_SENT."""
    if isinstance(exc, BrokerUnreachableError):
        return Delivery.NOT_SENT
    if exc.status is not None:
        return delivery_of_answer(exc.status, exc.problem)
    if isinstance(exc, OutcomeUnknownError):
        return Delivery.MAYBE
    return Delivery.NOT_SENT
