"""TransactionService on a real store (local log, and a one-member DLedger log) with an injected
clock: half messages invisible, commit visible once (in one entry with its op record), rollback
never, ends idempotent and conflicts refused, check-back rounds counted in the log up to
transactionCheckMax then discarded, and all of it the same after a restart."""

from __future__ import annotations

import time

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.errors import BrokerCode, BrokerError
from broker.message import Message
from broker.role_change import wait_until_master
from broker.transaction.service import HALF_TOPIC, TransactionService
from broker.transaction.state import TransactionState
from tests.integration.test_broker_store import make_config


class Clock:
    """The master's clock, moved by hand from the real time (halves carry the real store time)."""

    def __init__(self) -> None:
        self.t0 = self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


async def open_with_tx(cfg: BrokerConfig, clock: Clock) -> tuple[BrokerController, TransactionService]:
    ctl = BrokerController(cfg)
    tx = TransactionService(
        ctl.store, timeout_ms=6_000, check_interval_ms=30_000, check_max=2, clock_ms=clock
    )
    tx.install()
    await ctl.start()
    await wait_until_master(ctl.store, timeout_s=10)
    return ctl, tx


async def half(tx: TransactionService, body: bytes, group: str = "pg") -> str:
    msg = tx.half_message(
        Message("T", body, keys=["k1"], properties={"PGROUP": group, "TRAN_MSG": "true"}), "T", 0
    )
    await tx.store.put_messages(HALF_TOPIC, [msg], 0, _system=True)
    return msg.properties["UNIQ_KEY"]


def visible(store) -> list[bytes]:
    return [m.body for m in store.get_messages("T", 0, 0, 100).messages]


@pytest.fixture(params=["local", "dledger"])
def cfg(request, tmp_path) -> BrokerConfig:
    return make_config(request.param, str(tmp_path))


async def test_commit_rollback_idempotent_and_conflicting_ends(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, tx = await open_with_tx(cfg, clock)
    try:
        await ctl.store.topics.create_or_update("T", 1, 1)
        a, b = await half(tx, b"commit-me"), await half(tx, b"roll-me-back")
        assert visible(ctl.store) == []
        assert await tx.end("T", a, "COMMIT") is TransactionState.COMMITTED
        assert await tx.end("T", a, "commit") is TransactionState.COMMITTED  # repeated: same answer
        assert await tx.end("T", b, "ROLLBACK", producer_group="pg") is TransactionState.ROLLED_BACK
        got = ctl.store.get_messages("T", 0, 0, 100).messages
        assert [m.body for m in got] == [b"commit-me"]  # once
        assert got[0].keys == ["k1"] and "TRAN_MSG" not in got[0].properties
        assert got[0].properties["__transactionId__"] == a
        for txid, res, code in (
            (a, "ROLLBACK", BrokerCode.TRANSACTION_CONFLICT),
            (b, "COMMIT", BrokerCode.TRANSACTION_CONFLICT),
            ("nope", "COMMIT", BrokerCode.TRANSACTION_NOT_FOUND),
            ("", "COMMIT", BrokerCode.INVALID_TRANSACTION_ID),
            (a, "MAYBE", BrokerCode.INVALID_REQUEST),
        ):
            with pytest.raises(BrokerError) as err:
                await tx.end("T", txid, res)
            assert err.value.code == code
        with pytest.raises(BrokerError) as err:
            await tx.end("T", await half(tx, b"x", group="other"), "COMMIT", producer_group="pg")
        assert err.value.code == BrokerCode.TRANSACTION_NOT_FOUND
    finally:
        await ctl.shutdown()


async def test_check_back_counts_then_discards_and_survives_restart(cfg: BrokerConfig) -> None:
    clock = Clock()
    ctl, tx = await open_with_tx(cfg, clock)
    await ctl.store.topics.create_or_update("T", 1, 1)
    open_id = await half(tx, b"left-open")
    answered = await half(tx, b"answered-by-check")
    clock.now = clock.t0 + 5_000
    await tx.check_round()
    assert await tx.hub.poll("pg", 10, 0) == []  # younger than transactionTimeOut
    clock.now = clock.t0 + 7_000
    await tx.check_round()
    checks = await tx.hub.poll("pg", 10, 0)
    assert sorted(c.transaction_id for c in checks) == sorted([open_id, answered])
    assert {c.check_times for c in checks} == {1} and checks[0].topic == "T"
    assert await tx.end("T", answered, "COMMIT", from_check=True) is TransactionState.COMMITTED
    clock.now = clock.t0 + 20_000
    await tx.check_round()
    assert await tx.hub.poll("pg", 10, 0) == []  # asked within transactionCheckInterval
    await ctl.shutdown()

    ctl, tx = await open_with_tx(cfg, clock)  # the count and the outcome come back from the log
    try:
        assert tx.table.get(open_id).check_times == 1
        assert tx.table.get(answered).state is TransactionState.COMMITTED
        clock.now = clock.t0 + 40_000
        await tx.check_round()
        assert [c.check_times for c in await tx.hub.poll("pg", 10, 0)] == [2]
        clock.now = clock.t0 + 80_000
        await tx.check_round()  # asked transactionCheckMax (2) times: discarded
        assert tx.table.get(open_id).state is TransactionState.DISCARDED and tx.discarded == 1
        with pytest.raises(BrokerError) as err:
            await tx.end("T", open_id, "COMMIT")
        assert err.value.code == BrokerCode.TRANSACTION_CONFLICT
        assert visible(ctl.store) == [b"answered-by-check"]
    finally:
        await ctl.shutdown()


async def test_a_state_snapshot_mid_way_keeps_every_outcome_and_the_halves_to_rescan(
    cfg: BrokerConfig,
) -> None:
    # The store re-writes all replicated state as a snapshot (ahead of retention) and, at start,
    # restores the last one before the records after it; the transactions' op state is in it.
    clock = Clock()
    ctl, tx = await open_with_tx(cfg, clock)
    await ctl.store.topics.create_or_update("T", 1, 1)
    done, left = await half(tx, b"committed-before"), await half(tx, b"open-across")
    assert await tx.end("T", done, "COMMIT") is TransactionState.COMMITTED
    await ctl.store.snapshots.write()
    late = await half(tx, b"committed-after")
    assert await tx.end("T", late, "COMMIT") is TransactionState.COMMITTED
    await ctl.shutdown()
    ctl, tx = await open_with_tx(cfg, clock)
    try:
        assert tx.table.get(done).state is TransactionState.COMMITTED
        assert tx.table.get(late).state is TransactionState.COMMITTED
        assert tx.table.get(left).state is TransactionState.OPEN
        assert visible(ctl.store) == [b"committed-before", b"committed-after"]
        with pytest.raises(BrokerError) as err:
            await tx.end("T", done, "ROLLBACK")
        assert err.value.code == BrokerCode.TRANSACTION_CONFLICT
    finally:
        await ctl.shutdown()
