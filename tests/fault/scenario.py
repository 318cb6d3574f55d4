"""Scenario runner: start a cluster, run the workload, apply a nemesis, heal, read everything back,
run every checker, write a JSON report (and the history) under the results dir, return the report.

Results dir: `$LEDGERMQ_FAULT_RESULTS` or `bench/results/fault/` (gitignored); `docs/RELIABILITY.md`
is written from those reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fault import checkers
from tests.fault.cluster import REPO, FaultCluster
from tests.fault.history import OK, Event, History, load_history, pair_operations
from tests.fault.workload import Workload, WorkloadConfig, final_reads

log = logging.getLogger("fault.scenario")
RESULTS = Path(os.environ.get("LEDGERMQ_FAULT_RESULTS", REPO / "bench" / "results" / "fault"))
NEW_MASTER_BOUND_S = 5.0


@dataclass
class Ctx:
    """What a nemesis function gets: the cluster, the history, a seeded RNG, its time budget, and
    a dict for row-specific observations that end up in the report."""

    cluster: FaultCluster
    history: History
    rng: random.Random
    duration_s: float
    workload: Workload
    extra: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.duration_s - (time.monotonic() - self.started)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, min(seconds, self.remaining())))


Nemesis = Callable[[Ctx], Awaitable[None]]


async def heal_everything(cluster: FaultCluster) -> None:
    """Undo every fault: heal links, resume paused members, restart dead ones."""
    await cluster.heal()
    for m in cluster.members:
        if m.paused:
            cluster.resume(m)
    for m in cluster.members:
        if not m.alive():
            try:
                await cluster.restart(m)
            except RuntimeError as exc:  # fail-stop (e.g. a corrupt log refused at start) is legal
                log.warning("event=member_fail_stop member=%s error=%s", m.name, exc)


def recovery_after_heal(events: list[Event]) -> float | None:
    """Seconds from the last `heal` nemesis event to the first ok send invoked after it."""
    heals = [e for e in events if e.process == "nemesis" and e.f == "heal" and e.type == OK]
    if not heals:
        return None
    t0 = heals[-1].time_ns
    firsts = [done.time_ns for inv, done in pair_operations(e for e in events if e.f == "send")
              if done is not None and done.type == OK and inv.time_ns >= t0]
    return round((min(firsts) - t0) / 1e9, 3) if firsts else None


def check_history(events: list[Event], member_logs: list[checkers.MemberLog]) -> dict[str, Any]:
    """Every checker over one history."""
    return {
        "counts": checkers.summarize(events),
        "total_queue": checkers.total_queue(events),
        "log_consistency": checkers.log_consistency(events),
        "consumer_offsets": checkers.consumer_offsets(events),
        "raft": checkers.raft_invariants(events),
        "new_master": checkers.new_master_times(events),
        "prefixes": checkers.committed_prefixes(member_logs),
        "recovery_after_heal_s": recovery_after_heal(events),
    }


async def run_scenario(name: str, row: int | str, tmp_path: Path, nemesis: Nemesis, *,
                       duration_s: float = 15.0, seed: int | None = None,
                       cluster_kwargs: dict[str, Any] | None = None,
                       workload: WorkloadConfig | None = None,
                       extra_histories: Callable[[], list[Path]] | None = None,
                       after_heal: Nemesis | None = None,
                       after_stop: Nemesis | None = None) -> dict[str, Any]:
    """Run one scenario end to end and return its report (also written to RESULTS/<name>.json)."""
    seed = int(os.environ.get("LEDGERMQ_FAULT_SEED", "0")) or seed or random.randrange(1, 2**31)
    rng = random.Random(seed)
    history = History(tmp_path / "history.jsonl")
    cluster = FaultCluster(tmp_path / "cluster", history, seed=seed, **(cluster_kwargs or {}))
    wl_cfg = workload or WorkloadConfig()
    t_start = time.monotonic()
    report: dict[str, Any] = {"scenario": name, "row": row, "seed": seed, "duration_s": duration_s}
    try:
        await cluster.start()
        wl = Workload(cluster, history, wl_cfg, seed=seed)
        await wl.start()
        ctx = Ctx(cluster, history, rng, duration_s, wl)
        await asyncio.sleep(1.0)  # a clean stretch before the first fault
        ctx.started = time.monotonic()
        await nemesis(ctx)
        await heal_everything(cluster)
        if after_heal is not None:
            await after_heal(ctx)
        await asyncio.sleep(2.0)  # writes resume after the heal (liveness is measured from it)
        await wl.stop()
        view = await cluster.wait_converged(timeout_s=40)
        if after_stop is not None:  # writes are over, the cluster is still up
            await after_stop(ctx)
        report["read_back_per_member"] = await final_reads(cluster, history, wl_cfg)
        events = list(history.events)
        for path in (extra_histories() if extra_histories else []):
            events += load_history(path)
        events.sort(key=lambda e: e.time_ns)
        report.update(check_history(events, cluster.member_logs(view)))
        report["extra"] = ctx.extra
        report["fail_stopped"] = [m.name for m in cluster.members if not m.alive()]
        report["wall_s"] = round(time.monotonic() - t_start, 1)
    finally:
        history.close()
        await cluster.stop()
        _save(name, report, tmp_path)
    return report


async def wait_group_drained(ctx: Ctx, group: str, topic: str = "jepsen", queues: int = 4,
                             limit_s: float = 40) -> None:
    """After-stop step of the consumer scenarios: poll the master until `group` has lag 0 on all
    `queues` of `topic`; records the seconds it took in ctx.extra["drained_s"] (None: never)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        leader = await ctx.cluster.wait_leader()
        r = await ctx.cluster.http.get(f"{leader.url}/consumers/{group}/offsets", params={"topic": topic})
        offsets = r.json().get("offsets", []) if r.status_code == 200 else []
        if len(offsets) == queues and all(o["lag"] == 0 for o in offsets):
            ctx.extra["drained_s"] = round(limit_s - (deadline - time.monotonic()), 1)
            return
        await asyncio.sleep(0.5)
    ctx.extra["drained_s"] = None


def _save(name: str, report: dict[str, Any], tmp_path: Path) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1, sort_keys=True, default=str))
    hist = tmp_path / "history.jsonl"
    if hist.exists():
        shutil.copyfile(hist, RESULTS / f"{name}.history.jsonl")
    log.info("event=scenario_done name=%s report=%s", name, json.dumps(brief(report), default=str))


def brief(report: dict[str, Any]) -> dict[str, Any]:
    """The one-line summary a failing assertion prints."""
    tq = report.get("total_queue", {})
    lc = report.get("log_consistency", {})
    return {
        "scenario": report.get("scenario"), "seed": report.get("seed"),
        "attempted": tq.get("attempted"), "acked": tq.get("acked"), "info": tq.get("info"),
        "failed": tq.get("failed"), "read": tq.get("read"), "lost": tq.get("lost_count"),
        "lost_sample": tq.get("lost", [])[:5], "duplicated": tq.get("duplicated_count"),
        "retry_duplicated": tq.get("retry_duplicated_count"), "unexpected": tq.get("unexpected_count"),
        "failed_but_read": tq.get("failed_but_read_count"),
        "inconsistent": lc.get("inconsistent_count"), "skips": lc.get("skip_count"),
        "holes": lc.get("hole_count"),
        "raft": {k: report.get("raft", {}).get(k)
                 for k in ("multiple_leaders", "commit_regressions", "max_term")},
        "new_master": report.get("new_master"), "prefixes_valid": report.get("prefixes", {}).get("valid"),
        "prefix_errors": report.get("prefixes", {}).get("errors"),
        "offsets_backwards": report.get("consumer_offsets", {}).get("backwards_count"),
        "recovery_after_heal_s": report.get("recovery_after_heal_s"), "extra": report.get("extra"),
        "fail_stopped": report.get("fail_stopped"),
    }


def assert_safe(report: dict[str, Any], *, new_master: bool = True, min_acked: int = 20) -> None:
    """The acceptance bar of every scenario."""
    b = json.dumps(brief(report), default=str)
    tq, lc = report["total_queue"], report["log_consistency"]
    assert tq["acked"] >= min_acked, f"too little progress to judge: {b}"
    assert tq["lost_count"] == 0, f"lost acked writes: {b}"
    assert tq["duplicated_count"] == 0, f"broker duplicates: {b}"
    assert tq["unexpected_count"] == 0 and tq["failed_but_read_count"] == 0, f"phantom writes: {b}"
    assert lc["valid"], f"inconsistent offsets / skips / holes: {b}"
    assert report["consumer_offsets"]["valid"], f"committed offsets moved backwards: {b}"
    assert report["raft"]["valid"], f"Raft invariant violated: {b}"
    assert report["prefixes"]["valid"], f"committed prefixes differ: {b}"
    if new_master:
        nm = report["new_master"]
        assert nm["missing"] == 0, f"a leader fault never saw a new master: {b}"
        assert nm["max_s"] is None or nm["max_s"] <= NEW_MASTER_BOUND_S, f"new master too slow: {b}"
