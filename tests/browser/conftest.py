"""Browser tests of the console: Playwright (PyPI) driving Debian's Chromium against real
processes — a name server, the 3-member DLedger set broker-a, the single broker broker-b and
`mqdashboard` — started once per module and stopped by PID.

Chromium comes from Debian (`apt-get install chromium`: `make test` / `.ci/run` install it when
root); without it, or without Playwright, the tests skip with a message. Every request a page
makes is recorded, and anything not addressed to loopback is refused and kept for the check that
no request leaves the machine. Screenshots go to $CONSOLE_SCREENSHOT_DIR (default: a temporary
directory); `docs/console/` holds the ones the README shows."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    start_broker,
    start_dledger_set,
    start_namesrv,
    wait_http,
    wait_master,
)
from tests.ports import free_port

CHROMIUM = Path("/usr/bin/chromium")
# The flags this closed network needs: without the background-networking ones Chromium keeps
# trying to reach Google's hosts (refused here), which would also pollute the request record.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]
MAX_RECONSUME_TIMES = 1
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
# A laptop screen.
VIEWPORT = {"width": 1366, "height": 768}


def _playwright_or_skip() -> Any:
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is missing: browser tests need Debian's chromium "
            "(make test / .ci/run install it when run as root: apt-get install chromium)",
            allow_module_level=True,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)
    return sync_playwright


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "ws", "wss"):
        return True  # data:, blob:, about: never reach the network
    return (parts.hostname or "") in LOOPBACK_HOSTS or (parts.hostname or "").startswith("127.")


@dataclass
class Cluster:
    """The processes of the module's cluster and their addresses."""

    group: ProcessGroup
    namesrv: str
    dledger: dict[str, str]  # selfId -> http addr (broker-a)
    single: str  # broker-b
    console: str  # http://127.0.0.1:port
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(4))

    def master_id(self, exclude: frozenset[str] = frozenset()) -> str:
        return wait_master(self.dledger, timeout_s=20, exclude=set(exclude))

    def run(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Run an SDK call on a worker thread: the sync SDK runs its own event loop, which must not
        share a thread with Playwright's."""
        return self.pool.submit(fn, *args, **kw).result(timeout=120)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _playwright_or_skip()
    workdir = tmp_path_factory.mktemp("console")
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        # One redelivery, then the DLQ: the dead-letter test needs no long retry loop.
        dledger = start_dledger_set(group, workdir, ns, maxReconsumeTimes=str(MAX_RECONSUME_TIMES))
        single_conf = CONF / "broker-single.conf"
        single = start_broker(group, workdir, single_conf, "broker-b", ns, brokerName="broker-b")
        wait_master(dledger, timeout_s=30)
        port = free_port()
        group.start("console", "console", "-n", ns, "--port", str(port))
        console = f"http://127.0.0.1:{port}"
        wait_http(f"{console}/health", proc=group.procs["console"])
        _wait_registered(console)
        c = Cluster(group, ns, dledger, single, console)
        yield c
        c.pool.shutdown(wait=True)
    finally:
        group.stop_all()
        for name in group.procs:
            if name == "console" and group.procs[name].returncode not in (0, -signal.SIGTERM, None):
                sys.stderr.write(group.log_text(name)[-4000:])


def _wait_registered(console: str, timeout_s: float = 20.0) -> None:
    """Until the name server lists both broker sets with a master (the console asks it)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        html = httpx.get(f"{console}/cluster", timeout=5).text
        if 'data-testid="master-broker-a"' in html and 'data-testid="master-broker-b"' in html:
            return
        time.sleep(0.2)
    raise AssertionError(f"the console did not list broker-a and broker-b with a master in {timeout_s}s")


@dataclass
class BrowserSession:
    """One Chromium page and the record of every request any page of the browser made."""

    page: Any
    requests: list[str]
    refused: list[str]
    shots: Path
    chromium: Any = None

    def screenshot(self, name: str, page: Any = None) -> Path:
        path = self.shots / f"{name}.png"
        (page or self.page).screenshot(path=str(path), full_page=True)
        return path

    def new_page(self) -> Any:
        """A page in a context of its own (its own cookies), recorded and guarded like the first."""
        return _open_page(self.chromium, self.requests, self.refused)


def _open_page(chromium: Any, requests: list[str], refused: list[str]) -> Any:
    context = chromium.new_context(viewport=VIEWPORT, timezone_id="UTC")
    context.on("request", lambda req: requests.append(req.url))

    def guard(route: Any) -> None:
        if is_loopback(route.request.url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    page.set_default_timeout(15_000)
    page.on("dialog", lambda dialog: dialog.accept())
    return page


@pytest.fixture(scope="module")
def browser(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserSession]:
    sync_playwright = _playwright_or_skip()
    shots = Path(os.environ.get("CONSOLE_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    requests: list[str] = []
    refused: list[str] = []
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = _open_page(chromium, requests, refused)
            yield BrowserSession(page, requests, refused, shots, chromium)
        finally:
            chromium.close()


ADMIN_TOKEN = "console-admin-secret"
ORDERS_TOKEN = "orders-team-secret"


@dataclass
class AclCluster:
    namesrv: str
    broker: str
    console: str


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclCluster]:
    """A name server, one broker with aclEnable=true and a console of their own: an admin account
    and `orders-team` (PUB|SUB on topic orders, SUB on group billing)."""
    _playwright_or_skip()
    workdir = tmp_path_factory.mktemp("console-acl")
    acl_file = workdir / "acl.json"
    acl_file.write_text(
        json.dumps(
            {
                "accounts": [
                    {"name": "ops", "token": ADMIN_TOKEN, "admin": True},
                    {
                        "name": "orders-team",
                        "token": ORDERS_TOKEN,
                        "topicPerms": {"orders": "PUB|SUB"},
                        "groupPerms": {"billing": "SUB"},
                    },
                ]
            }
        )
    )
    group = ProcessGroup(workdir)
    try:
        ns = start_namesrv(group, workdir)
        broker = start_broker(
            group,
            workdir,
            CONF / "broker-single.conf",
            "broker-acl",
            ns,
            brokerName="broker-acl",
            aclEnable="true",
            aclConfigFile=str(acl_file),
        )
        port = free_port()
        group.start("console-acl", "console", "-n", ns, "--port", str(port))
        console = f"http://127.0.0.1:{port}"
        wait_http(f"{console}/health", proc=group.procs["console-acl"])
        yield AclCluster(ns, broker, console)
    finally:
        group.stop_all()
