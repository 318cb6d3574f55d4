"""Console page views on a 2-set cluster with 100 topics and 20 consumer groups: requests and time.

Starts a name server, broker-a (3 DLedger members), broker-b (single broker) and `mqdashboard`,
creates 100 topics on both sets and 20 groups with committed offsets, then loads each page
`--views` times in Debian's Chromium (Playwright) and reports per page: the requests the browser
made, the requests the console made to name server and brokers (`X-Console-Backend-Requests`),
the console's own render time (`Server-Timing`) and the time until the browser's `load` event
(p50 / p95). Issue #17's bound: <= 20 requests and < 1 s per page view.

Prints a table and writes bench/results/console_bench.json.

    .venv/bin/python bench/console_bench.py [--views 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from client import Admin  # noqa: E402
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, VIEWPORT  # noqa: E402
from tests.integration._ledgermq_procs import (  # noqa: E402
    CONF,
    ProcessGroup,
    start_broker,
    start_dledger_set,
    start_namesrv,
    wait_http,
    wait_master,
)
from tests.ports import free_port  # noqa: E402

RESULTS = REPO / "bench" / "results"
TOPICS = 100
GROUPS = 20


def populate(namesrv: str) -> None:
    """100 topics on both sets; 20 groups, each with committed offsets on one topic."""
    with Admin(namesrv) as admin:
        for i in range(TOPICS):
            admin.update_topic(f"load-{i:03d}", 4, 4)
        for g in range(GROUPS):
            admin.reset_offset_by_time(f"group-{g:02d}", f"load-{g:03d}", 0)


def measure(console: str, pages: list[str], views: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        for path in pages:
            page.goto(console + path)  # warm: connections, the browser's cache of css/js
            wall, server, backend, browser_reqs = [], [], [], []
            for _ in range(views):
                seen: list[str] = []

                def record(req: Any, seen: list[str] = seen) -> None:
                    seen.append(req.url)

                page.on("request", record)
                t0 = time.perf_counter()
                response = page.goto(console + path, wait_until="load")
                wall.append((time.perf_counter() - t0) * 1000)
                page.remove_listener("request", record)
                timing = response.headers.get("server-timing", "render;dur=0")
                server.append(float(timing.split("dur=")[1]))
                backend.append(int(response.headers["x-console-backend-requests"]))
                browser_reqs.append(len(seen))
            out[path] = {
                "views": views,
                "browser_requests": max(browser_reqs),
                "backend_requests": max(backend),
                "requests_per_view": max(b + c for b, c in zip(browser_reqs, backend, strict=True)),
                "server_ms_p50": round(statistics.median(server), 1),
                "load_ms_p50": round(statistics.median(wall), 1),
                "load_ms_p95": round(sorted(wall)[int(0.95 * (len(wall) - 1))], 1),
            }
        browser.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--views", type=int, default=20)
    args = p.parse_args()
    if not CHROMIUM.exists():
        print(f"{CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
        workdir = Path(tmp)
        group = ProcessGroup(workdir)
        try:
            ns = start_namesrv(group, workdir)
            dledger = start_dledger_set(group, workdir, ns)
            start_broker(group, workdir, CONF / "broker-single.conf", "broker-b", ns, brokerName="broker-b")
            wait_master(dledger, timeout_s=30)
            port = free_port()
            group.start("console", "console", "-n", ns, "--port", str(port))
            console = f"http://127.0.0.1:{port}"
            wait_http(f"{console}/health")
            populate(ns)
            time.sleep(1.5)  # registrations carry the new topics to the name server
            pages = [
                "/cluster",
                "/topics",
                "/groups",
                "/topics/load-000",
                "/groups/group-00",
                "/messages?topic=load-000&key=none",
                "/throughput",
            ]
            report = measure(console, pages, args.views)
        finally:
            group.stop_all()
    print(
        f"{'page':<20}{'requests/view':>15}{'console->cluster':>18}{'render p50 ms':>15}"
        f"{'load p50 ms':>13}{'load p95 ms':>13}"
    )
    for path, r in report.items():
        print(
            f"{path:<20}{r['requests_per_view']:>15}{r['backend_requests']:>18}{r['server_ms_p50']:>15}"
            f"{r['load_ms_p50']:>13}{r['load_ms_p95']:>13}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"topics": TOPICS, "groups": GROUPS, "broker_sets": 2, "members": 4, "pages": report}
    (RESULTS / "console_bench.json").write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
