"""The message model under a leader crash loop (issue 15), on a real name server + 3-member set:
thousands of pending timers, open transactions resolved by commit, rollback and check-back, and
FIFO groups consumed by several consumers — while the leader is SIGKILLed and restarted again and
again, beside the usual produce/consume workload and its checkers.

Checked (`msgmodel_checkers`): every timer fired exactly once and never before its time, none
lost; no rolled-back transaction's message ever visible, every committed one visible once; a FIFO
group's next message never handed out before the previous one was acked. Read back from every
member after the heal.

`fault` = the CI subset (2,000 timers, one short crash loop); `fault_full` = 10,000 timers, longer.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fault.history import History
from tests.fault.msgmodel_checkers import fifo_order, timers, transactions
from tests.fault.scenario import Ctx, assert_safe, brief, run_scenario
from tests.fault.test_scenarios import leader_crash_loop

pytestmark = pytest.mark.timeout(300)

DELAY_TOPIC, TX_TOPIC, FIFO_TOPIC = "mm-delay", "mm-tx", "mm-fifo"
TX_GROUP, FIFO_GROUP = "pg-fault", "cg-fault"
CONF = {
    "transactionTimeOut": 1000,
    "transactionCheckInterval": 1000,
    "transactionCheckMax": 1000,
    "maxReconsumeTimes": 1000,
}


async def _leader_url(ctx: Ctx) -> str:
    leader, _ = ctx.cluster.current_leader()
    if leader is None:
        leader = await ctx.cluster.wait_leader(timeout_s=15)
    return leader.url


async def _call(ctx: Ctx, method: str, path: str, timeout_s: float = 20, **kw: Any) -> httpx.Response:
    """A request to the current leader, retried through elections (the caller records outcomes)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            r = await ctx.cluster.http.request(method, (await _leader_url(ctx)) + path, timeout=4.0, **kw)
            if r.status_code not in (421, 503):
                return r
        except (httpx.HTTPError, AssertionError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{method} {path}: no leader answered within {timeout_s} s")
        await asyncio.sleep(0.2)


async def _send(ctx: Ctx, h: History, f: str, topic: str, items: list[tuple[Any, dict[str, Any]]]) -> list:
    """One produce of `items` ([(history value, message)]) recorded as one op per message."""
    invs = [
        h.invoke(f, "mm-producer", value, **({"deliverAt": m["deliverAt"]} if "deliverAt" in m else {}))
        for value, m in items
    ]
    try:
        r = await ctx.cluster.http.post(
            f"{await _leader_url(ctx)}/topics/{topic}/messages",
            json={"messages": [m for _, m in items]},
            timeout=8.0,
        )
    except (httpx.HTTPError, AssertionError) as exc:
        for inv in invs:
            h.info(inv, repr(exc))
        return []
    if r.status_code == 200:
        results = r.json()["results"]
        for inv, res in zip(invs, results, strict=True):
            h.ok(inv, **{k: v for k, v in res.items() if k in ("deliverAt", "transactionId")})
        return results
    for inv in invs:
        (h.fail if 400 <= r.status_code < 500 or r.status_code == 421 else h.info)(inv, r.text[:120])
    return []


async def _setup(ctx: Ctx, n_timers: int, n_tx: int, groups: int, per_group: int) -> dict[str, Any]:
    for topic, kind in ((DELAY_TOPIC, "DELAY"), (TX_TOPIC, "TRANSACTION"), (FIFO_TOPIC, "FIFO")):
        r = await _call(
            ctx,
            "PUT",
            f"/topics/{topic}",
            json={"readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "attributes": {"message.type": kind}},
        )
        assert r.status_code == 200, r.text
    h = ctx.history
    t0 = int(time.time() * 1000)
    spread_ms = int(max(ctx.duration_s - 4, 4) * 1000)
    for start in range(0, n_timers, 500):  # due from 3 s on, over the crash loop
        batch = [
            (f"d{i}", {"body": f"d{i}", "deliverAt": t0 + 3000 + (i * 7919) % spread_ms})
            for i in range(start, min(n_timers, start + 500))
        ]
        await _send(ctx, h, "send_delayed", DELAY_TOPIC, batch)
    txids: dict[str, str] = {}
    for start in range(0, n_tx, 100):
        batch = [
            (f"t{i}", {"body": f"t{i}", "transactional": True, "producerGroup": TX_GROUP})
            for i in range(start, min(n_tx, start + 100))
        ]
        results = await _send(ctx, h, "tx_half", TX_TOPIC, batch)
        txids.update({value: res["transactionId"] for (value, _), res in zip(batch, results, strict=False)})
    for seq in range(per_group):
        batch = [
            (
                {"group": f"g{g}", "seq": seq, "body": f"g{g}:{seq}"},
                {
                    "body": f"g{g}:{seq}",
                    "messageGroup": f"g{g}",
                    "properties": {"g": f"g{g}", "seq": str(seq)},
                },
            )
            for g in range(groups)
        ]
        await _send(ctx, h, "fifo_send", FIFO_TOPIC, batch)
    return {"txids": txids, "t0": t0, "last_due": t0 + 3000 + spread_ms}


def _resolution(body: str) -> str:
    """t0, t3, ... commit; t1, t4, ... roll back; t2, t5, ... left to the check-back, which commits
    every other one."""
    i = int(body[1:])
    if i % 3 == 2:
        return "COMMIT" if i % 6 == 2 else "ROLLBACK"
    return "COMMIT" if i % 3 == 0 else "ROLLBACK"


async def _end(ctx: Ctx, body: str, txid: str, from_check: bool) -> None:
    resolution = _resolution(body)
    inv = ctx.history.invoke("tx_end", "mm-tx-producer", {"body": body, "resolution": resolution})
    try:
        r = await ctx.cluster.http.post(
            f"{await _leader_url(ctx)}/topics/{TX_TOPIC}/transactions/{txid}/{resolution.lower()}",
            json={"fromTransactionCheck": from_check},
            timeout=4.0,
        )
    except (httpx.HTTPError, AssertionError) as exc:
        ctx.history.info(inv, repr(exc))
        return
    if r.status_code == 200:
        ctx.history.ok(inv)
    elif r.status_code in (400, 404, 409, 421):
        ctx.history.fail(inv, r.text[:120])
    else:
        ctx.history.info(inv, r.text[:120])


async def _tx_producer(ctx: Ctx, txids: dict[str, str], stop: asyncio.Event) -> None:
    """Ends the transactions it decided on during the crash loop, answers check-backs for the rest."""
    direct = [b for b in txids if int(b[1:]) % 3 != 2]
    while not stop.is_set():
        for _ in range(5):
            if direct:
                body = direct.pop()
                await _end(ctx, body, txids[body], from_check=False)
        try:
            r = await ctx.cluster.http.get(
                f"{await _leader_url(ctx)}/producers/{TX_GROUP}/transaction-checks",
                params={"waitMs": 300, "maxChecks": 32},
                timeout=4.0,
            )
            checks = r.json()["checks"] if r.status_code == 200 else []
        except (httpx.HTTPError, AssertionError, ValueError):
            checks = []
        for c in checks:
            await _end(ctx, c["message"]["body"], c["transactionId"], from_check=True)
        await asyncio.sleep(0.05)


async def _fifo_consumer(ctx: Ctx, name: str, stop: asyncio.Event) -> None:
    h = ctx.history
    while not stop.is_set():
        inv = h.invoke("fifo_receive", name)
        try:
            r = await ctx.cluster.http.post(
                f"{await _leader_url(ctx)}/consumers/{FIFO_GROUP}/receive",
                json={"topic": FIFO_TOPIC, "maxMessages": 4, "invisibleMs": 3000, "waitMs": 300},
                timeout=4.0,
            )
        except (httpx.HTTPError, AssertionError) as exc:
            h.info(inv, repr(exc))
            await asyncio.sleep(0.2)
            continue
        if r.status_code != 200:
            h.fail(inv, r.text[:120])
            await asyncio.sleep(0.2)
            continue
        batch = r.json()["messages"]
        h.ok(inv, {"messages": [[m["properties"]["g"], int(m["properties"]["seq"])] for m in batch]})
        for m in batch:
            await asyncio.sleep(ctx.rng.uniform(0, 0.05))  # "processing"
            ack = h.invoke("fifo_ack", name, [m["properties"]["g"], int(m["properties"]["seq"])])
            try:
                a = await ctx.cluster.http.post(
                    f"{await _leader_url(ctx)}/consumers/{FIFO_GROUP}/ack",
                    json={"topic": FIFO_TOPIC, "receiptHandles": [m["receiptHandle"]]},
                    timeout=4.0,
                )
            except (httpx.HTTPError, AssertionError) as exc:
                h.info(ack, repr(exc))
                continue
            status = a.json()["results"][0]["status"] if a.status_code == 200 else a.text[:80]
            if status == "OK":
                h.ok(ack)
            else:
                h.fail(ack, str(status))


async def _read_topic(ctx: Ctx, f: str, topic: str, timer: bool) -> None:
    """Every message of `topic` from every live member, recorded as `f` reads."""
    for m in ctx.cluster.members:
        if not m.alive() or m.paused:
            continue
        for q in range(4):
            offset = 0
            rows: list[list[Any]] = []
            while True:
                r = await ctx.cluster.http.get(
                    f"{m.url}/topics/{topic}/queues/{q}/messages",
                    params={"offset": offset, "maxMessages": 512},
                    timeout=10.0,
                )
                page = r.json()
                for msg in page["messages"]:
                    row = [msg["queueOffset"], msg["body"]]
                    if timer:
                        row += [msg["storeTimestamp"], int(msg["properties"].get("TIMER_DELIVER_MS", 0))]
                    rows.append(row)
                if page["nextOffset"] >= page["maxOffset"] or page["nextOffset"] == offset:
                    break
                offset = page["nextOffset"]
            inv = ctx.history.invoke(f, "reader", node=m.name)
            ctx.history.ok(inv, {"queue": f"{topic}/{q}", "messages": rows})


async def _message_model_run(
    tmp_path: Path, name: str, *, n_timers: int, n_tx: int, groups: int, per_group: int, duration_s: float
) -> dict[str, Any]:
    state: dict[str, Any] = {}
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def nemesis(ctx: Ctx) -> None:
        state.update(await _setup(ctx, n_timers, n_tx, groups, per_group))
        tasks.append(asyncio.create_task(_tx_producer(ctx, state["txids"], stop)))
        tasks.extend(asyncio.create_task(_fifo_consumer(ctx, f"fifo-c{i}", stop)) for i in range(3))
        ctx.started = time.monotonic()  # the crash loop's whole budget starts after the set-up
        await leader_crash_loop(ctx)

    async def after_stop(ctx: Ctx) -> None:
        # every timer is due; the check-backs settle what was left open; the FIFO groups drain
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done_fifo = fifo_order(ctx.history.events)["undelivered_count"] == 0
            if int(time.time() * 1000) > state["last_due"] + 3000 and done_fifo:
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(3)  # the last check-back round
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        ctx.history.close_open_as_info(processes={"mm-tx-producer", "fifo-c0", "fifo-c1", "fifo-c2"})
        await ctx.cluster.wait_converged(timeout_s=40)
        await _read_topic(ctx, "timer_read", DELAY_TOPIC, timer=True)
        await _read_topic(ctx, "tx_read", TX_TOPIC, timer=False)
        events = sorted(ctx.history.events, key=lambda e: e.time_ns)
        ctx.extra["timers"] = timers(events)
        ctx.extra["transactions"] = transactions(events)
        ctx.extra["fifo"] = fifo_order(events)

    report = await run_scenario(
        name,
        "msgmodel",
        tmp_path,
        nemesis,
        duration_s=duration_s,
        cluster_kwargs={"conf_overrides": CONF},
        after_stop=after_stop,
    )
    return report


def _assert_message_model(report: dict[str, Any], n_timers: int) -> None:
    assert_safe(report)
    extra = report["extra"]
    b = json.dumps(brief(report), default=str)[:2000]
    assert extra["timers"]["valid"], f"timers: {json.dumps(extra['timers'])[:1500]} {b}"
    assert extra["timers"]["delivered"] >= 0.95 * n_timers, extra["timers"]
    assert extra["transactions"]["valid"], f"transactions: {json.dumps(extra['transactions'])[:1500]}"
    assert extra["fifo"]["valid"] and extra["fifo"]["undelivered_count"] == 0, f"fifo: {extra['fifo']}"
    assert report["new_master"]["faults"] >= 2, b


@pytest.mark.fault
async def test_msgmodel_leader_crash_loop(tmp_path: Path) -> None:
    report = await _message_model_run(
        tmp_path, "msgmodel_leader_crash_loop", n_timers=2000, n_tx=60, groups=10, per_group=6, duration_s=14
    )
    _assert_message_model(report, 2000)


@pytest.mark.fault_full
async def test_msgmodel_leader_crash_loop_10k_timers(tmp_path: Path) -> None:
    report = await _message_model_run(
        tmp_path,
        "msgmodel_leader_crash_loop_10k",
        n_timers=10_000,
        n_tx=300,
        groups=40,
        per_group=10,
        duration_s=45,
    )
    _assert_message_model(report, 10_000)
