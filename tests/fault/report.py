"""Render the last fault-suite run (the JSON reports under `bench/results/fault/`) as the Markdown
results table of docs/RELIABILITY.md.

    python -m tests.fault.report            # print the table
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.fault.scenario import RESULTS

COLUMNS = ("scenario", "seed", "attempted", "acked", "info", "failed", "read back", "lost", "dup (broker)",
           "dup (retry)", "inconsistent / skips / holes", "leaders/term", "prefixes", "new master max s",
           "wall s")


def row(r: dict[str, Any]) -> list[str]:
    """One table row from one report."""
    tq, lc, nm = r.get("total_queue", {}), r.get("log_consistency", {}), r.get("new_master", {})
    raft, pre = r.get("raft", {}), r.get("prefixes", {})
    if not tq:
        blank = ["—"] * (len(COLUMNS) - 3)
        return [r.get("scenario", "?"), str(r.get("seed")), *blank, str(r.get("wall_s", "—"))]
    return [
        r["scenario"], str(r["seed"]), str(tq["attempted"]), str(tq["acked"]), str(tq["info"]),
        str(tq["failed"]), str(tq["read"]), str(tq["lost_count"]), str(tq["duplicated_count"]),
        str(tq["retry_duplicated_count"]),
        f"{lc.get('inconsistent_count')} / {lc.get('skip_count')} / {lc.get('hole_count')}",
        "ok" if not raft.get("multiple_leaders") else f"VIOLATED {raft['multiple_leaders']}",
        f"identical ({len(pre.get('compared', []))} pairs, idx {pre.get('max_committed_index')})"
        if pre.get("valid") else f"DIFFER {pre.get('errors', [])[:1]}",
        "—" if nm.get("max_s") is None else f"{nm['max_s']:.2f} ({nm['faults']} faults)",
        str(r.get("wall_s", "—")),
    ]


def render(results: Path = RESULTS) -> str:
    """The Markdown table for every report in `results`, by scenario name."""
    reports = [json.loads(p.read_text()) for p in sorted(results.glob("*.json"))]
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in reports]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render() + "\n")
