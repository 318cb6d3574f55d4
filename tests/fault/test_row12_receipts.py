"""Matrix row 12 on the receipt API (`/consumers/{group}/receive|ack`): consumer crash mid-batch.

The broker's group consumption is shared-queue (RocketMQ 5 "simple consumer" / pop): every
consumer of a group receives from every queue, so "at most one owner per queue" has no meaning
here. What it guarantees instead, per message, and what `checkers.receipts` checks on the merged
histories: within one master term a message is held by at most one delivery at a time (handed
out again only once its invisible time has passed), each redelivery invalidates the earlier
receipt handle (an ack with it answers EXPIRED), a message is acknowledged OK at most once and
never delivered again after that. On top: redelivery after a crash (every acked produce is
received at least once), the group's committed offset per queue never moves backwards, and the
group drains to lag 0.

Two consumer processes share group `g2`; every 1-3 s one of them is SIGKILLed (often between
receive and ack) and replaced.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fault.checkers import receipts, term_change_times
from tests.fault.cluster import PY, REPO
from tests.fault.history import OK, load_history, pair_operations
from tests.fault.scenario import Ctx, _save, assert_safe, brief, run_scenario, wait_group_drained

pytestmark = pytest.mark.timeout(240)

GROUP = "g2"
INVISIBLE_MS = 1500


@pytest.mark.fault_full
async def test_row12_receipt_consumers_crash_mid_batch(tmp_path: Path) -> None:
    histories: list[Path] = []
    procs: list[subprocess.Popen] = []

    def spawn(ctx: Ctx) -> subprocess.Popen:
        path = tmp_path / f"receipt-consumer-{len(histories)}.jsonl"
        histories.append(path)
        urls = ",".join(m.url for m in ctx.cluster.members)
        with open(tmp_path / "receipt-consumer.log", "ab") as err:
            p = subprocess.Popen([PY, "-m", "tests.fault.receipt_consumer_worker", "--members", urls,
                                  "--group", GROUP, "--topic", "jepsen", "--history", str(path),
                                  "--first-op-id", str(len(histories) * 10**9),
                                  "--invisible-ms", str(INVISIBLE_MS)],
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=err)
        procs.append(p)
        return p

    async def nemesis(ctx: Ctx) -> None:
        live = [spawn(ctx), spawn(ctx)]
        while ctx.remaining() > 1:
            await ctx.sleep(ctx.rng.uniform(1, 3))
            i = ctx.rng.randrange(len(live))
            os.kill(live[i].pid, signal.SIGKILL)
            live[i].wait(5)
            ctx.history.nemesis("kill_consumer", live[i].pid)
            live[i] = spawn(ctx)


    try:
        report = await run_scenario("row12_receipt_consumers_crash", 12, tmp_path, nemesis, duration_s=15,
                                    extra_histories=lambda: [p for p in histories if p.exists()],
                                    after_stop=lambda ctx: wait_group_drained(ctx, GROUP))
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
    assert_safe(report, new_master=False)
    assert report["extra"]["drained_s"] is not None, f"the group never drained: {brief(report)}"
    events = load_history(tmp_path / "history.jsonl") + [e for p in histories if p.exists()
                                                         for e in load_history(p)]
    events.sort(key=lambda e: e.time_ns)
    res = receipts(events, term_change_times(events))
    report["extra"]["receipts"] = {k: v for k, v in res.items() if not isinstance(v, list) or v}
    _save(report["scenario"], report, tmp_path)
    assert res["valid"], f"receipt guarantees broken: {report['extra']['receipts']}"
    assert res["acked"] > 50 and res["redeliveries"] > 0, f"the kills caused no redelivery: {res}"
    # Committed offsets of the group (read by the consumers) never moved backwards.
    assert report["consumer_offsets"]["valid"] and report["consumer_offsets"]["reads"] > 10, brief(report)
    # At least once: every acked produce reached some consumer of the group.
    acked = {inv.value for inv, done in pair_operations(e for e in events if e.f == "send")
             if done is not None and done.type == OK}
    received = {body for e in events if e.f == "receive" and e.type == OK
                for _, _, body, _ in e.value["messages"]}
    assert acked <= received, f"{len(acked - received)} acked messages never received: {brief(report)}"
