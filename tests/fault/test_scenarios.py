"""Jepsen-style scenarios on real processes: matrix rows 1-16 of the reliability note (§A3), plus
the harness self-tests that prove the checkers can fail.

Each test starts a name server and a 3-member DLedger broker set, runs producers and long-poll
consumers over HTTP while a nemesis injects its faults, heals, reads every queue back from every
member, and runs every checker (`scenario.assert_safe`: lost acked = 0, broker duplicates = 0,
consistent offsets, one leader per term, identical committed prefixes, new master within 5 s).
Reports (counts attempted / acked / info / read back) land in `bench/results/fault/<name>.json`.

`fault` = CI subset (runs in `make test`); `fault_full` = only with `make fault`.
Replay a run: LEDGERMQ_FAULT_SEED=<seed from the report> pytest tests/fault/test_scenarios.py -k <name>
"""

from __future__ import annotations

import asyncio
import collections
import math
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from dledger.entry import BODY_OFFSET
from dledger.store.checkpoint import read_checkpoint
from tests.fault import diskfaults
from tests.fault.cluster import PY, REPO
from tests.fault.history import FAIL, INFO, OK, Event, load_history, pair_operations
from tests.fault.scenario import Ctx, _save, assert_safe, brief, run_scenario, wait_group_drained
from tests.fault.workload import WorkloadConfig

pytestmark = pytest.mark.timeout(240)
fault = pytest.mark.fault
fault_full = pytest.mark.fault_full


def _events(tmp_path: Path) -> list[Event]:
    return load_history(tmp_path / "history.jsonl")


def _nemesis_time(events: list[Event], f: str) -> list[int]:
    return [e.time_ns for e in events if e.process == "nemesis" and e.f == f and e.type == OK]


# -- row 1 -------------------------------------------------------------------------------------------
@fault
async def test_row01_baseline(tmp_path: Path) -> None:
    async def nothing(ctx: Ctx) -> None:
        await ctx.sleep(ctx.duration_s)

    report = await run_scenario("row01_baseline", 1, tmp_path, nothing, duration_s=6)
    assert_safe(report, min_acked=50)
    assert report["total_queue"]["info"] == 0, brief(report)  # no faults: every outcome is known


# -- row 2 -------------------------------------------------------------------------------------------
async def leader_crash_loop(ctx: Ctx, gap_s: tuple[float, float] = (3, 5),
                            down_s: tuple[float, float] = (2, 3), random_member: float = 0.0) -> None:
    """SIGKILL the leader (or, with probability `random_member`, any member) and restart it."""
    while ctx.remaining() > 1:
        await ctx.sleep(ctx.rng.uniform(*gap_s))
        leader, _ = ctx.cluster.current_leader()
        if leader is None:
            continue
        if ctx.rng.random() < random_member:
            leader = ctx.rng.choice(ctx.cluster.members)
        ctx.cluster.kill(leader)
        await asyncio.sleep(ctx.rng.uniform(*down_s))
        await ctx.cluster.restart(leader)


@fault
async def test_row02_leader_crash_loop(tmp_path: Path) -> None:
    report = await run_scenario("row02_leader_crash_loop", 2, tmp_path, leader_crash_loop, duration_s=14)
    assert_safe(report)
    assert report["new_master"]["faults"] >= 2, brief(report)


@fault_full
async def test_row02_leader_crash_loop_long(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        await leader_crash_loop(ctx, gap_s=(5, 10), down_s=(2, 5), random_member=0.3)

    report = await run_scenario("row02_leader_crash_loop_long", 2, tmp_path, nemesis, duration_s=60)
    assert_safe(report)


# -- row 3 -------------------------------------------------------------------------------------------
@fault_full
async def test_row03_deposed_leader_pause(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        while ctx.remaining() > 6:
            await ctx.sleep(2)
            leader, term = ctx.cluster.current_leader()
            if leader is None:
                continue
            ctx.cluster.pause(leader)
            await asyncio.sleep(4)  # > election timeout: the others elect a new leader
            ctx.cluster.resume(leader)
            ctx.extra.setdefault("paused", []).append({"member": leader.name, "term": term})
            await ctx.sleep(3)

    report = await run_scenario("row03_deposed_leader", 3, tmp_path, nemesis, duration_s=20)
    assert_safe(report)
    events = _events(tmp_path)
    resumes = _nemesis_time(events, "resume")
    for (pause, t_resume) in zip(report["extra"]["paused"], resumes, strict=False):
        # The old master steps down (DLedger role and broker role) within 5 s of waking up.
        later = [e for e in events if e.f == "status" and e.type == OK and e.node == pause["member"]
                 and e.time_ns >= t_resume]
        flipped = next((e for e in later
                        if e.value.get("role") != "LEADER" or e.value.get("term") > pause["term"]), None)
        assert flipped is not None, f"{pause} never stepped down: {brief(report)}"
        assert (flipped.time_ns - t_resume) / 1e9 <= 5.0
        slave = next((e for e in later if e.value.get("brokerRole") == "SLAVE"), None)
        assert slave is not None and (slave.time_ns - t_resume) / 1e9 <= 5.0, "broker role never flipped"


# -- row 4 -------------------------------------------------------------------------------------------
async def isolate_leader(ctx: Ctx, hold_s: float) -> None:
    await ctx.sleep(1)
    leader, term = ctx.cluster.current_leader()
    assert leader is not None, "no leader to isolate"
    await ctx.cluster.isolate(leader.name)
    ctx.extra["isolated"] = {"member": leader.name, "term": term}
    await asyncio.sleep(hold_s)
    await ctx.cluster.heal()
    await ctx.sleep(ctx.remaining())


def minority_acks(events: list[Event], member: str) -> int:
    """Sends to the isolated member invoked after the partition that were acked before the heal."""
    t_part = _nemesis_time(events, "partition")[0]
    t_heal = _nemesis_time(events, "heal")[0]
    return sum(1 for inv, done in pair_operations(e for e in events if e.f == "send")
               if inv.node == member and inv.time_ns >= t_part and done is not None and done.type == OK
               and done.time_ns < t_heal)


@fault
async def test_row04_leader_in_minority(tmp_path: Path) -> None:
    report = await run_scenario("row04_leader_minority", 4, tmp_path, lambda ctx: isolate_leader(ctx, 6),
                                duration_s=9)
    assert_safe(report)
    assert minority_acks(_events(tmp_path), report["extra"]["isolated"]["member"]) == 0, brief(report)
    assert report["recovery_after_heal_s"] is not None and report["recovery_after_heal_s"] < 5, brief(report)


# -- row 5 -------------------------------------------------------------------------------------------
@fault_full
async def test_row05_flapping_partitions(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        names = [m.name for m in ctx.cluster.members]
        while ctx.remaining() > 1:
            shape = ctx.rng.choice(["halves", "bridge", "heal"])
            await ctx.cluster.heal()
            order = ctx.rng.sample(names, len(names))
            if shape == "halves":
                await ctx.cluster.partition({order[0]}, set(order[1:]))
            elif shape == "bridge":  # order[2] sees both, the other two cannot see each other
                await ctx.cluster.block(order[0], order[1])
                await ctx.cluster.block(order[1], order[0])
            ctx.extra.setdefault("shapes", []).append(shape)
            await ctx.sleep(ctx.rng.uniform(2, 4))

    report = await run_scenario("row05_flapping", 5, tmp_path, nemesis, duration_s=30)
    assert_safe(report, new_master=False)  # a bridge may keep the leader; liveness is the heal bound
    assert report["recovery_after_heal_s"] is not None and report["recovery_after_heal_s"] < 5, brief(report)


# -- row 6 -------------------------------------------------------------------------------------------
@fault_full
async def test_row06_one_way_link(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        await ctx.sleep(1)
        leader, term = ctx.cluster.current_leader()
        follower = next(m for m in ctx.cluster.members if m is not leader)
        await ctx.cluster.block(follower.name, leader.name)  # follower→leader dropped, leader→follower ok
        ctx.extra["term_before"] = term
        await asyncio.sleep(10)
        ctx.extra["term_at_heal"] = ctx.cluster.max_term()
        await ctx.cluster.heal()
        await ctx.sleep(ctx.remaining())

    report = await run_scenario("row06_one_way", 6, tmp_path, nemesis, duration_s=13)
    assert_safe(report, new_master=False)
    # No runaway term growth: pre-vote / check-quorum keep the cut-off follower from churning terms.
    assert report["extra"]["term_at_heal"] - report["extra"]["term_before"] <= 2, brief(report)


# -- row 17 ------------------------------------------------------------------------------------------
# A push window this workload fills within a second of the cut: 2 batches of 16 KiB in flight (the
# defaults, 32 x 1 MiB, would take a far heavier load to fill, and so to tell backoff from resends).
SMALL_PUSH_WINDOW = {"max_pending_push_batches": 2, "max_batch_push_size": 16 * 1024}


@fault
async def test_row17_partitioned_follower_push_backoff(tmp_path: Path) -> None:
    """A follower cut off for 10 s: the leader backs off (one-entry probes, exponential backoff)
    instead of resending its whole push window every push timeout, so the bytes it sends towards
    the follower during the cut stay under 2x one push window; after the heal the follower is
    caught up within seconds."""
    window = SMALL_PUSH_WINDOW["max_pending_push_batches"] * SMALL_PUSH_WINDOW["max_batch_push_size"]

    async def nemesis(ctx: Ctx) -> None:
        await ctx.sleep(1)
        leader = await ctx.cluster.wait_leader()
        follower = next(m for m in ctx.cluster.members if m is not leader)
        link = f"{leader.name}->{follower.name}"
        before = (await ctx.cluster.proxy_stats())[link]["dropped_forward"]
        await ctx.cluster.isolate(follower.name)
        await asyncio.sleep(10)
        cut_bytes = (await ctx.cluster.proxy_stats())[link]["dropped_forward"] - before
        await ctx.cluster.heal()
        healed = time.monotonic()
        target = ((await ctx.cluster.status(leader, 2.0)) or {}).get("dledger", {}).get("ledgerEndIndex", 0)
        caught_up = None
        while time.monotonic() - healed < 15:
            st = await ctx.cluster.status(follower)
            if st and st["dledger"]["committedIndex"] >= target:
                caught_up = round(time.monotonic() - healed, 2)
                break
            await asyncio.sleep(0.05)
        ctx.extra.update(leader=leader.name, follower=follower.name, cut_bytes=cut_bytes, window=window,
                         catch_up_s=caught_up, target_index=target)
        await ctx.sleep(ctx.remaining())

    report = await run_scenario("row17_push_backoff", 17, tmp_path, nemesis, duration_s=14,
                                cluster_kwargs={"dledger_overrides": SMALL_PUSH_WINDOW})
    assert_safe(report, new_master=False)  # the leader keeps its majority
    extra = report["extra"]
    assert extra["cut_bytes"] < 2 * window, brief(report)
    assert extra["catch_up_s"] is not None and extra["catch_up_s"] < 5, brief(report)


# -- row 7 -------------------------------------------------------------------------------------------
async def power_loss_and_pause(ctx: Ctx) -> None:
    while ctx.remaining() > 4:
        await ctx.sleep(2)
        leader, _ = ctx.cluster.current_leader()
        if leader is None:
            continue
        other = ctx.rng.choice([m for m in ctx.cluster.members if m is not leader])
        ctx.cluster.pause(other)
        await asyncio.sleep(0.5)
        ctx.extra.setdefault("cuts", []).append(ctx.cluster.kill(leader, power_loss=True))
        await asyncio.sleep(1.5)
        ctx.cluster.resume(other)
        await ctx.cluster.restart(leader)


@fault_full
async def test_row07_power_loss_plus_pause_sync_flush(tmp_path: Path) -> None:
    report = await run_scenario("row07_power_loss_pause", 7, tmp_path, power_loss_and_pause, duration_s=20,
                                cluster_kwargs={"record_fsync": True, "flush_disk_type": "SYNC_FLUSH"})
    assert_safe(report)


# -- row 8 -------------------------------------------------------------------------------------------
async def coordinated_power_loss(ctx: Ctx, cycles: int = 2) -> None:
    for _ in range(cycles):
        await asyncio.sleep(2.5)  # load on the new leader before the next loss (not clamped)
        term = ctx.cluster.max_term()
        for m in ctx.cluster.members:
            ctx.extra.setdefault("cuts", []).append(
                ctx.cluster.kill(m, power_loss=True, count_as_leader_fault=False))
        for m in ctx.cluster.members:
            ctx.cluster.start_member(m)
        for m in ctx.cluster.members:
            await ctx.cluster.wait_member_up(m)
        # New master within 5 s of the group being back (process start-up on 2 shared cores is
        # 2-4 s and says nothing about the election).
        ctx.cluster.mark_leader_fault("restart_all", term)
        await ctx.cluster.wait_leader(timeout_s=10)


@fault
async def test_row08_coordinated_power_loss_sync_flush(tmp_path: Path) -> None:
    """Caught docs/RELIABILITY.md finding 5 (fixed): a consume queue's unfsynced tail was lost
    while DefaultMessageStore.start() resumed the reput at the largest max_phys_end of all queues,
    so the lost units were never rebuilt (`event=cq_gap`, a hole in that member's final read)."""
    report = await run_scenario("row08_coordinated_power_loss", 8, tmp_path, coordinated_power_loss,
                                duration_s=8,
                                cluster_kwargs={"record_fsync": True, "flush_disk_type": "SYNC_FLUSH"})
    assert_safe(report)
    assert sum(c["bytes_zeroed"] for c in report["extra"]["cuts"]) >= 0


@fault_full
async def test_row08_async_flush_power_loss_loss_is_bounded(tmp_path: Path) -> None:
    """ASYNC_FLUSH (DLedger's default: ack from the page cache of a majority, fsync every 10 ms):
    a coordinated power loss may lose acked writes, but only ones acked shortly before it."""
    report = await run_scenario("row08_async_flush_power_loss", 8, tmp_path, coordinated_power_loss,
                                duration_s=8,
                                cluster_kwargs={"record_fsync": True, "flush_disk_type": "ASYNC_FLUSH"})
    events = _events(tmp_path)
    kills = _nemesis_time(events, "kill")
    group_up = _nemesis_time(events, "restart_all")
    final = {body for e in events if e.f == "final_read" and e.type == OK for _, body in e.value["messages"]}
    windows = []
    for inv, done in pair_operations(e for e in events if e.f == "send"):
        if done is None or done.type != OK or inv.value in final:
            continue
        # The workers share the test's event loop with the synchronous kills, so an answer sent just
        # before a power loss can be read only after it. An answer read before the group was back up
        # was sent before that loss: its window is at most the request's whole time before the cut.
        spanned = [k for k in kills if inv.time_ns <= k <= done.time_ns
                   and not any(k <= u <= done.time_ns for u in group_up)]
        if spanned:
            windows.append(spanned[0] - inv.time_ns)
        else:
            windows.append(min((k for k in kills if k >= done.time_ns), default=math.inf) - done.time_ns)
    report["extra"]["loss_window_max_s"] = max(windows, default=0) / 1e9
    _save(report["scenario"], report, tmp_path)  # with the measured window
    assert report["total_queue"]["duplicated_count"] == 0 and report["raft"]["valid"], brief(report)
    assert report["extra"]["loss_window_max_s"] <= 1.0, f"lost a write acked long before: {brief(report)}"


# -- row 9 -------------------------------------------------------------------------------------------
@fault_full
async def test_row09_torn_tail(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        while ctx.remaining() > 3:
            await ctx.sleep(2)
            leader, _ = ctx.cluster.current_leader()
            victim = (leader if leader is not None and ctx.rng.random() < 0.6
                      else ctx.rng.choice(ctx.cluster.members))
            ctx.cluster.kill(victim)
            ctx.extra.setdefault("torn", []).append(ctx.cluster.torn_tail(victim))
            await ctx.cluster.restart(victim)

    report = await run_scenario("row09_torn_tail", 9, tmp_path, nemesis, duration_s=16,
                                cluster_kwargs={"record_fsync": True})
    assert_safe(report)


# -- row 10 ------------------------------------------------------------------------------------------
async def minority_corruption(ctx: Ctx, in_body: bool = True) -> None:
    """Flip one bit of a follower's entry at or below its checkpointed committed index (so the
    store cannot simply cut an uncommitted tail), restart it: it must cut, re-fetch from the leader
    and rejoin by itself, never leading while it is below its catch-up watermark. Then the leader
    is killed, so the group has to elect with the (possibly still recovering) victim."""
    await ctx.sleep(3)
    leader, _ = ctx.cluster.current_leader()
    victim = next(m for m in ctx.cluster.members if m is not leader)
    ctx.cluster.kill(victim)
    committed = read_checkpoint(str(victim.dledger_dir / "checkpoint")).committed_index
    data_dir, index_dir = victim.dledger_dir / "data", victim.dledger_dir / "index"
    locs = {e.index: e for e in diskfaults.entries(data_dir, index_dir)}
    # An entry with a body in the same data file as the checkpointed committed entry (recovery
    # checks the last three files and the committed entry's), preferably not that file's first.
    same_file = diskfaults.data_file_for(data_dir, locs[committed].pos)[0] if committed in locs else None
    candidates = [i for i in range(max(1, committed - 50), committed + 1)
                  if i in locs and locs[i].size > BODY_OFFSET
                  and diskfaults.data_file_for(data_dir, locs[i].pos)[0] == same_file]
    assert candidates, f"{victim.name}: no committed entry to corrupt (checkpoint committed {committed})"
    index = ctx.rng.choice(candidates)
    ctx.extra["flip"] = ctx.cluster.bit_flip(victim, index=index, in_body=in_body)
    ctx.extra["checkpoint_committed"] = committed
    ctx.extra["victim"] = victim.name
    log_mark = victim.log_path.stat().st_size if victim.log_path.exists() else 0
    ctx.extra["victim_log_from"] = log_mark
    await ctx.cluster.restart(victim)  # no fail-stop: the member recovers by itself
    await ctx.sleep(2)
    leader, _ = ctx.cluster.current_leader()
    if leader is not None and leader is not victim:
        ctx.cluster.kill(leader)
        await asyncio.sleep(2)
        await ctx.cluster.restart(leader)
    await ctx.sleep(ctx.remaining())


def assert_rejoined_after_corruption(report: dict, tmp_path: Path) -> None:
    """The victim cut below its checkpointed commit index, caught up, never led meanwhile, and now
    holds and serves the same committed bytes as the others."""
    extra = report["extra"]
    victim = extra["victim"]
    assert victim not in report["fail_stopped"], brief(report)
    assert 0 < extra["flip"]["index"] <= extra["checkpoint_committed"], brief(report)
    with open(tmp_path / "cluster" / f"{victim}.log", "rb") as f:
        f.seek(extra["victim_log_from"])
        lines = f.read().decode(errors="replace").splitlines()
    cut = next((i for i, line in enumerate(lines) if "event=committed_entries_cut" in line), None)
    assert cut is not None, f"{victim} never cut its corrupt committed entry: {brief(report)}"
    assert f"lastGoodIndex={extra['flip']['index'] - 1} " in lines[cut], lines[cut]
    done = next((i for i in range(cut, len(lines)) if "event=catch_up_complete" in lines[i]), None)
    assert done is not None, f"{victim} never caught up past its watermark: {brief(report)}"
    led = [line for line in lines[cut:done] if f"selfId={victim}" in line and "-> LEADER" in line]
    assert not led, f"{victim} led while recovering: {led}"
    fields = {k: int(v) for k, v in re.findall(
        r"(lastGoodIndex|checkpointCommitted|oldEnd|catchUpWatermark)=(\d+)", lines[cut])}
    fields["endAtCatchUp"] = int(re.search(r" end=(\d+)", lines[done]).group(1))
    stamps = [datetime.strptime(lines[i][:23], "%Y-%m-%d %H:%M:%S,%f") for i in (cut, done)]
    extra["recovery"] = {**fields,
                         "reason": lines[cut].rsplit(": ", 1)[-1].split(";", 1)[0][:120],
                         "cut_to_caught_up_s": round((stamps[1] - stamps[0]).total_seconds(), 2)}
    _save(report["scenario"], report, tmp_path)  # the report again, with the recovery log lines
    assert any(victim in (c["a"], c["b"]) for c in report["prefixes"]["compared"]), brief(report)
    assert report["read_back_per_member"][victim] == report["total_queue"]["read"], brief(report)


@fault
async def test_row10_minority_corruption(tmp_path: Path) -> None:
    report = await run_scenario("row10_minority_corruption", 10, tmp_path, minority_corruption, duration_s=10)
    assert_safe(report)
    assert_rejoined_after_corruption(report, tmp_path)


@fault_full
async def test_row10_minority_header_corruption(tmp_path: Path) -> None:
    """A flip in an entry's header (magic, size, index, term, pos...) rather than its body: the
    body CRC cannot see it, the header checks and the index record cross-check do."""
    report = await run_scenario("row10_minority_header_corruption", 10, tmp_path,
                                lambda ctx: minority_corruption(ctx, in_body=False), duration_s=10)
    assert_safe(report)
    assert_rejoined_after_corruption(report, tmp_path)


OLD_FILE_DATA_SIZE = 16 * 1024  # small DLedger data files, so a 10 s run leaves far more than three


async def minority_old_file_corruption(ctx: Ctx) -> None:
    """Like `minority_corruption`, but the flipped entry sits in the victim's first data file, far
    before recovery's scan (the last three files): recovery cannot see it, the background
    verification after start must, cut there with a catch-up watermark, and the victim re-fetches,
    never leading meanwhile. Then the leader is killed, as in `minority_corruption`."""
    await ctx.sleep(3)
    leader, _ = ctx.cluster.current_leader()
    victim = next(m for m in ctx.cluster.members if m is not leader)
    data_dir, index_dir = victim.dledger_dir / "data", victim.dledger_dir / "index"
    # Enough files that the first is well outside recovery's scan. The workload writes them at its
    # own pace (slower on a loaded machine): wait for them, not for the scenario's clock.
    for _ in range(100):
        if len(diskfaults.log_files(data_dir)) >= 6:
            break
        await asyncio.sleep(0.2)
    ctx.cluster.kill(victim)
    committed = read_checkpoint(str(victim.dledger_dir / "checkpoint")).committed_index
    files = diskfaults.log_files(data_dir)
    assert len(files) >= 6, f"{victim.name}: only {len(files)} data files"
    locs = diskfaults.entries(data_dir, index_dir)
    first_file = [e for e in locs if diskfaults.data_file_for(data_dir, e.pos)[0] == files[0]]
    candidates = [e.index for e in first_file[1:] if e.size > BODY_OFFSET and e.index <= committed]
    assert candidates, f"{victim.name}: no committed entry in {files[0]} (checkpoint committed {committed})"
    index = ctx.rng.choice(candidates)
    ctx.extra["flip"] = ctx.cluster.bit_flip(victim, index=index, in_body=True)
    ctx.extra["checkpoint_committed"] = committed
    ctx.extra["victim"] = victim.name
    ctx.extra["victim_data_files"] = len(files)
    ctx.extra["victim_log_from"] = victim.log_path.stat().st_size if victim.log_path.exists() else 0
    await ctx.cluster.restart(victim)
    await asyncio.sleep(2)  # whatever the scenario's clock says: the victim first catches up
    leader, _ = ctx.cluster.current_leader()
    if leader is not None and leader is not victim:
        ctx.cluster.kill(leader)
        await asyncio.sleep(2)
        await ctx.cluster.restart(leader)
    await ctx.sleep(ctx.remaining())


def _victim_log_lines(report: dict, tmp_path: Path) -> list[str]:
    extra = report["extra"]
    with open(tmp_path / "cluster" / f"{extra['victim']}.log", "rb") as f:
        f.seek(extra["victim_log_from"])
        return f.read().decode(errors="replace").splitlines()


@fault_full
async def test_row10_minority_old_file_corruption(tmp_path: Path) -> None:
    report = await run_scenario("row10_minority_old_file_corruption", 10, tmp_path,
                                minority_old_file_corruption, duration_s=10,
                                cluster_kwargs={"conf_overrides": {
                                    "mappedFileSizeCommitLog": OLD_FILE_DATA_SIZE}})
    assert_safe(report)
    lines = _victim_log_lines(report, tmp_path)
    recovered = next(line for line in lines if "event=store_recovered" in line)
    assert "committed_entries_cut" not in "".join(lines[:lines.index(recovered)]), \
        "recovery itself saw the flip: the entry was not outside its scan"
    verified = [line for line in lines if "event=old_files_verify_end" in line]
    assert verified and "result=corrupt" in verified[0], verified
    assert_rejoined_after_corruption(report, tmp_path)


# -- row 11 ------------------------------------------------------------------------------------------
@fault_full
async def test_row11_clock_skew(tmp_path: Path) -> None:
    """n1's wall clock runs 45 s ahead, n2's strobes between +-20 s; n0's is true. Safety must not
    change; only storeTimestamp follows the master's (skewed) clock."""
    launch = {"n1": ["--clock-offset-ms=45000"], "n2": ["--clock-strobe-ms=20000"]}
    report = await run_scenario("row11_clock_skew", 11, tmp_path, leader_crash_loop, duration_s=15,
                                cluster_kwargs={"launch_args": launch})
    assert_safe(report)


# -- row 12 ------------------------------------------------------------------------------------------
@fault_full
async def test_row12_consumer_crash_mid_batch(tmp_path: Path) -> None:
    histories: list[Path] = []
    procs: list[subprocess.Popen] = []

    def spawn(ctx: Ctx) -> subprocess.Popen:
        path = tmp_path / f"consumer-{len(histories)}.jsonl"
        histories.append(path)
        urls = ",".join(m.url for m in ctx.cluster.members)
        p = subprocess.Popen([PY, "-m", "tests.fault.consumer_worker", "--members", urls, "--group", "g1",
                              "--topic", "jepsen", "--queues", "4", "--history", str(path),
                              "--first-op-id", str((len(histories)) * 10**9)], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=open(tmp_path / "consumer.log", "ab"))
        procs.append(p)
        return p

    async def nemesis(ctx: Ctx) -> None:
        p = spawn(ctx)
        while ctx.remaining() > 1:
            await ctx.sleep(ctx.rng.uniform(1, 3))
            os.kill(p.pid, signal.SIGKILL)
            p.wait(5)
            ctx.history.nemesis("kill_consumer", p.pid)
            p = spawn(ctx)


    try:
        # A consumer killed while still importing never opened its history: it did nothing.
        report = await run_scenario("row12_consumer_crash", 12, tmp_path, nemesis, duration_s=15,
                                    extra_histories=lambda: [p for p in histories if p.exists()],
                                    after_stop=lambda ctx: wait_group_drained(ctx, "g1"))
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
    assert_safe(report, new_master=False)
    assert report["consumer_offsets"]["reads"] > 10, brief(report)
    assert report["extra"]["drained_s"] is not None, f"the consumers never caught up: {brief(report)}"
    # At least once: every acked message reached some consumer incarnation.
    events = _events(tmp_path) + [e for p in histories if p.exists() for e in load_history(p)]
    acked = {inv.value for inv, done in pair_operations(e for e in events if e.f == "send")
             if done is not None and done.type == OK}
    delivered = {body for e in events if e.f == "poll" and e.type == OK and e.process.startswith("consumer-")
                 for _, body in e.value["messages"]}
    assert acked <= delivered, f"{len(acked - delivered)} acked messages never delivered: {brief(report)}"
    report["extra"]["redelivered"] = sum(1 for e in events if e.f == "poll" and e.type == OK
                                         and e.process.startswith("consumer-")
                                         for _ in e.value["messages"]) - len(delivered)
    report["extra"]["delivered"] = len(delivered)
    _save(report["scenario"], report, tmp_path)


# -- row 13 ------------------------------------------------------------------------------------------
@fault_full
async def test_row13_long_poll_across_failover(tmp_path: Path) -> None:
    wait_ms = 2000
    report = await run_scenario("row13_long_poll_failover", 13, tmp_path, leader_crash_loop, duration_s=15,
                                workload=WorkloadConfig(pollers=4, poll_wait_ms=wait_ms))
    assert_safe(report)
    polls = [(inv, done) for inv, done in pair_operations(e for e in _events(tmp_path) if e.f == "poll")
             if done is not None and done.type == OK]
    assert polls, brief(report)
    slowest = max((done.time_ns - inv.time_ns) / 1e9 for inv, done in polls)
    assert slowest <= wait_ms / 1000 + 3, f"a long poll overran its wait: {slowest:.2f}s"


# -- row 14: tests/fault/test_container_scenario.py ----------------------------------------------------


# -- row 15 ------------------------------------------------------------------------------------------
@fault_full
async def test_row15_namesrv_outage(tmp_path: Path) -> None:
    async def nemesis(ctx: Ctx) -> None:
        url = f"http://127.0.0.1:{ctx.cluster.namesrv_port}/routes/jepsen"
        async with httpx.AsyncClient(timeout=2) as http:
            before = (await http.get(url)).json()  # the client's cached route
            ctx.extra["route_brokers"] = [b["brokerName"] for b in before.get("brokers", [])]
            ctx.cluster.kill_namesrv()
            await ctx.sleep(ctx.duration_s - 2)
            await ctx.cluster.restart_namesrv()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 40:
                r = await http.get(url)
                if r.status_code == 200 and r.json().get("brokers"):
                    ctx.extra["reregistered_after_s"] = round(time.monotonic() - t0, 1)
                    break
                await asyncio.sleep(0.5)

    # Brokers re-register every registerNameServerPeriod (RocketMQ's 30 s by default; 5 s here).
    report = await run_scenario("row15_namesrv_outage", 15, tmp_path, nemesis, duration_s=32,
                                cluster_kwargs={"conf_overrides": {"registerNameServerPeriod": 5000}})
    assert_safe(report, new_master=False)
    events = _events(tmp_path)
    t_kill, t_back = _nemesis_time(events, "kill_namesrv")[0], _nemesis_time(events, "start_namesrv")[0]
    during = sum(1 for inv, done in pair_operations(e for e in events if e.f == "send")
                 if done is not None and done.type == OK and t_kill < inv.time_ns < t_back)
    assert during > 20, "brokers stopped serving while the name server was down"
    assert report["extra"].get("reregistered_after_s") is not None, brief(report)


# -- row 16 ------------------------------------------------------------------------------------------
async def pause_and_crash_leader(ctx: Ctx) -> None:
    """Row 16's nemesis: a 1.5 s SIGSTOP of the leader (every request to it times out, so the
    producers' retries are certain, and a new leader is elected meanwhile), then a SIGKILL and
    restart of the leader, in turn."""
    pause = True
    while ctx.remaining() > 1:
        await ctx.sleep(ctx.rng.uniform(2, 3))
        leader, _ = ctx.cluster.current_leader()
        if leader is None:
            continue
        if pause:
            ctx.cluster.pause(leader)
            await asyncio.sleep(1.5)
            ctx.cluster.resume(leader)
        else:
            ctx.cluster.kill(leader)
            await asyncio.sleep(ctx.rng.uniform(1, 2))
            await ctx.cluster.restart(leader)
        pause = not pause


def _send_infos(tmp_path: Path) -> int:
    """Produce attempts whose outcome was unknown (each one is followed by a retry)."""
    return sum(1 for e in _events(tmp_path) if e.f == "send" and e.type == INFO)


@fault_full
async def test_row16_producer_retries_idempotent(tmp_path: Path) -> None:
    cfg = WorkloadConfig(short_timeouts=True, retries=3, idempotent=True)
    report = await run_scenario("row16_retries_idempotent", 16, tmp_path, pause_and_crash_leader,
                                duration_s=12, workload=cfg)
    assert_safe(report)
    assert _send_infos(tmp_path) > 0, "no produce outcome was unknown: no retry was exercised"
    assert report["total_queue"]["retry_duplicated_count"] == 0, brief(report)


@fault_full
async def test_row16_producer_retries_without_keys_reports_duplicates_apart(tmp_path: Path) -> None:
    cfg = WorkloadConfig(short_timeouts=True, retries=3, idempotent=False)
    report = await run_scenario("row16_retries_plain", 16, tmp_path, pause_and_crash_leader,
                                duration_s=12, workload=cfg)
    assert_safe(report)  # retry duplicates are counted apart and are not a broker fault
    assert _send_infos(tmp_path) > 0, "no produce outcome was unknown: no retry was exercised"


# -- disk full ---------------------------------------------------------------------------------------
@fault_full
async def test_disk_full_refuses_writes_definitely(tmp_path: Path) -> None:
    """Every member restarted with a disk-full ratio below the disk's real usage: produces must be
    refused with 507 DISK_FULL (a definite failure: never stored, never read back), nothing
    crashes, and writes resume once the members restart with the normal ratio."""
    full = ["--dledger=disk_space_ratio_to_force_clean=0.0", "--dledger=enable_disk_force_clean=false",
            "--dledger=disk_space_ratio_to_check_expired=0.99"]

    async def restart_all(ctx: Ctx, args: list[str]) -> None:
        for m in ctx.cluster.members:
            ctx.cluster.launch_args[m.name] = args
            ctx.cluster.kill(m, count_as_leader_fault=False)
        for m in ctx.cluster.members:
            ctx.cluster.start_member(m)
        for m in ctx.cluster.members:
            await ctx.cluster.wait_member_up(m)
        await ctx.cluster.wait_leader(timeout_s=10)

    async def nemesis(ctx: Ctx) -> None:
        await asyncio.sleep(2)
        await restart_all(ctx, full)
        ctx.history.nemesis("disk_full_on")
        await asyncio.sleep(4)
        ctx.history.nemesis("disk_full_off")
        await restart_all(ctx, [])

    report = await run_scenario("disk_full", "disk", tmp_path, nemesis, duration_s=8)
    assert_safe(report, new_master=False)
    events = _events(tmp_path)
    t_on, t_off = _nemesis_time(events, "disk_full_on")[0], _nemesis_time(events, "disk_full_off")[0]
    # Writes sent and answered while every disk was full. One still in flight at t_off is cut by
    # the restart that frees the disks (a killed process: indeterminate by nature), not refused.
    during = [done for inv, done in pair_operations(e for e in events if e.f == "send")
              if done is not None and t_on + 1e9 < inv.time_ns and done.time_ns < t_off]
    assert during, "no write attempted while the disk was full"
    assert all(d.type != OK for d in during), "a write was acked while every member's disk was full"
    # Refusals are definite (the append never happened), whatever the code. Which code clients
    # see is recorded: 507 DISK_FULL is the contract; see docs/RELIABILITY.md finding 9.
    codes = collections.Counter(f"{d.extra.get('status')} {d.error}" for d in during)
    report["extra"]["refusals"] = dict(codes)
    _save(report["scenario"], report, tmp_path)
    assert all(d.type == FAIL for d in during), f"indeterminate outcomes while full: {codes}"


# -- harness self-tests: the suite must be able to fail ------------------------------------------------
async def isolate_leader_and_write_to_it(ctx: Ctx, hold_s: float) -> None:
    """Isolate the leader and keep every producer writing to it until the heal."""
    await ctx.sleep(1)
    leader, term = ctx.cluster.current_leader()
    assert leader is not None, "no leader to isolate"
    await ctx.cluster.isolate(leader.name)
    ctx.workload.pin["member"] = leader
    ctx.extra["isolated"] = {"member": leader.name, "term": term}
    await asyncio.sleep(hold_s)
    ctx.workload.pin["member"] = None
    await ctx.cluster.heal()
    await ctx.sleep(ctx.remaining())


@fault
async def test_selftest_async_flush_power_loss_is_caught(tmp_path: Path) -> None:
    """ASYNC_FLUSH acks from the page cache of a majority; a coordinated power loss with a slow
    flush (60 s) loses acked writes, and the checker must see it. This is the suite proving it can
    fail, and it measures the bounded loss of ASYNC_FLUSH documented in docs/RELIABILITY.md."""
    report = await run_scenario("selftest_async_flush_power_loss", "self-test", tmp_path,
                                lambda ctx: coordinated_power_loss(ctx, cycles=1), duration_s=4,
                                cluster_kwargs={"record_fsync": True, "flush_disk_type": "ASYNC_FLUSH",
                                                "dledger_overrides": {"flush_file_interval_ms": 60000}})
    assert report["total_queue"]["lost_count"] > 0, f"no loss under ASYNC_FLUSH power loss: {brief(report)}"


@fault_full
async def test_selftest_unsafe_ack_before_quorum_is_caught(tmp_path: Path) -> None:
    """With DLedger's debug switch `unsafe_ack_before_quorum`, writes forced at an isolated leader
    are acked (after the broker's 2 s dispatch wait) though no majority has them; the heal truncates
    them. The checker must report them lost; the same scenario without the switch (row 4) loses
    nothing."""
    report = await run_scenario("selftest_unsafe_ack", "self-test", tmp_path,
                                lambda ctx: isolate_leader_and_write_to_it(ctx, 5), duration_s=7,
                                cluster_kwargs={"unsafe_ack": True})
    assert report["total_queue"]["lost_count"] > 0, (
        f"acking before quorum lost nothing: the suite cannot see losses: {brief(report)}")


@fault_full
async def test_row04_writes_forced_at_isolated_leader_are_never_acked(tmp_path: Path) -> None:
    """The control for the self-test above: same faults, switch off → no ack, no loss."""
    report = await run_scenario("row04_forced_minority_writes", 4, tmp_path,
                                lambda ctx: isolate_leader_and_write_to_it(ctx, 5), duration_s=7)
    assert_safe(report)
    assert minority_acks(_events(tmp_path), report["extra"]["isolated"]["member"]) == 0, brief(report)


if __name__ == "__main__":  # pragma: no cover - convenience: run the CI subset
    sys.exit(subprocess.call([PY, "-m", "pytest", "-q", "-m", "fault", __file__]))
