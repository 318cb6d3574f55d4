"""The console in a real browser against a real cluster (issue #17's acceptance).

One module-scoped cluster (tests/browser/conftest.py): name server, broker-a (3 DLedger members),
broker-b (single broker), `mqdashboard`. The tests run in file order; the one that kills broker-a's
master comes last but one, the check that no request left loopback last."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import httpx
import pytest
from playwright.sync_api import expect

from client import Admin, LedgerMQError, Producer, SimpleConsumer
from tests.browser.conftest import (
    ADMIN_TOKEN,
    MAX_RECONSUME_TIMES,
    ORDERS_TOKEN,
    AclCluster,
    BrowserSession,
    Cluster,
    is_loopback,
)

pytestmark = pytest.mark.browser

# The bound of issue #17: one page view of a 2-set cluster with 100 topics.
MAX_REQUESTS_PER_PAGE_VIEW = 20


def admin_call(c: Cluster, method: str, *args: object, **kw: object) -> object:
    """One `Admin` call, on a worker thread (see `Cluster.run`)."""

    def call() -> object:
        with Admin(c.namesrv) as a:
            return getattr(a, method)(*args, **kw)

    return c.run(call)


def test_broker_docs_render_operations_offline(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    master = cluster.dledger[cluster.master_id()]
    page.goto(f"http://{master}/docs")
    ops = page.locator(".opblock")
    expect(ops.first).to_be_visible()
    assert ops.count() >= 10, "Swagger UI rendered too few operations"
    expect(page.get_by_text("/topics/{topic}/messages").first).to_be_visible()
    browser.screenshot("broker-docs")
    page.goto(f"http://{master}/redoc")
    expect(page.get_by_role("heading", name="LedgerMQ broker broker-a").first).to_be_visible()
    summary = "Topic config and each queue's min/max offset"
    expect(page.get_by_role("heading", name=summary)).to_be_visible()
    page.goto(f"http://{cluster.namesrv}/docs")
    expect(page.get_by_text("/routes/{topic}").first).to_be_visible()


def test_cluster_page_shows_three_members_and_the_master(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    master_id = cluster.master_id()
    page.goto(f"{cluster.console}/cluster")
    section = page.locator("section.set", has=page.locator("#set-broker-a"))
    expect(section.locator("tbody tr")).to_have_count(3)
    expect(page.get_by_test_id("master-broker-a")).to_have_text(master_id)
    master_row = page.get_by_test_id(f"member-{cluster.dledger[master_id]}")
    expect(master_row.locator("td.role")).to_contain_text("MASTER")
    for sid, addr in cluster.dledger.items():
        if sid != master_id:
            expect(page.get_by_test_id(f"member-{addr}").locator("td.role")).to_contain_text("SLAVE")
    expect(page.get_by_test_id("master-broker-b")).to_have_text(cluster.single)
    browser.screenshot("cluster")


def test_keyboard_reaches_every_page_from_the_navigation(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    page.goto(f"{cluster.console}/cluster")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Cluster")).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{cluster.console}/topics")
    expect(page.get_by_role("link", name="Topics")).to_have_attribute("aria-current", "page")
    # Every form control is labelled.
    for control in page.locator("main input:not([type=hidden]), main select").all():
        assert control.evaluate("el => el.labels.length") > 0, control.evaluate("el => el.outerHTML")


def test_a_form_posted_from_another_site_is_refused(cluster: Cluster) -> None:
    r = httpx.post(
        f"{cluster.console}/topics",
        data={"topic": "csrf", "readQueueNums": "1", "writeQueueNums": "1", "perm": "6"},
        headers={"Origin": "http://127.0.0.2:9999"},
    )
    assert r.status_code == 403
    assert httpx.get(f"http://{cluster.single}/topics/csrf").status_code == 404


def test_a_topic_created_in_the_page_is_on_every_set(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    page.goto(f"{cluster.console}/topics")
    page.get_by_label("Topic", exact=True).fill("console-created")
    page.get_by_label("Read queues").fill("3")
    page.get_by_label("Write queues").fill("3")
    page.get_by_role("button", name="Create or update").click()
    notice = page.locator(".notice.ok")
    expect(notice).to_contain_text("console-created created or updated on broker-a, broker-b")
    expect(page.get_by_test_id("topic-console-created")).to_contain_text("broker-a, broker-b")
    for addr in (cluster.dledger[cluster.master_id()], cluster.single):
        doc = httpx.get(f"http://{addr}/topics/console-created", timeout=5).json()
        assert (doc["readQueueNums"], doc["writeQueueNums"], len(doc["queues"])) == (3, 3, 3), addr
    browser.screenshot("topics")
    page.get_by_role("link", name="console-created").click()
    expect(page.get_by_role("heading", name="Queues on broker-a")).to_be_visible()
    browser.screenshot("topic")


def test_bad_topic_name_is_an_error_in_the_page(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    page.goto(f"{cluster.console}/topics")
    # The browser's own pattern check is bypassed: the broker's refusal must reach the page.
    page.locator("input[name=topic]").evaluate("el => el.removeAttribute('pattern')")
    page.get_by_label("Topic", exact=True).fill("bad topic!")
    page.get_by_role("button", name="Create or update").click()
    expect(page.locator(".notice.error")).to_contain_text("INVALID")


def test_group_lag_drops_to_zero_as_a_consumer_drains(cluster: Cluster, browser: BrowserSession) -> None:
    admin_call(cluster, "update_topic", "orders", 2, 2, broker_name="broker-a")

    def produce() -> None:
        with Producer(cluster.namesrv) as p:
            p.send_batch("orders", [f"order-{i}" for i in range(40)])

    cluster.run(produce)
    consumer = cluster.run(SimpleConsumer, "billing", "orders", cluster.namesrv)
    try:
        first = cluster.run(consumer.receive, 4, 2000)
        assert first
        cluster.run(consumer.ack, *first)
        page = browser.page
        page.goto(f"{cluster.console}/groups")
        expect(page.get_by_test_id("group-billing")).to_be_visible()
        page.get_by_role("link", name="billing").click()
        lag = page.get_by_test_id("group-lag")
        expect(lag).not_to_have_text("0")
        assert int(lag.inner_text().replace(",", "")) > 0
        clients = page.get_by_test_id("clients-table")
        expect(clients).to_contain_text("HTTP")
        expect(clients).to_contain_text("SIMPLE_CONSUMER")  # the SDK says what it is and which SDK
        expect(clients).to_contain_text("PYTHON")
        browser.screenshot("group-lagging")
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                msgs = consumer.receive(8, 500)
                if msgs:
                    consumer.ack(*msgs)

        worker = cluster.pool.submit(drain)
        try:
            expect(lag).to_have_text("0", timeout=20_000)
        finally:
            stop.set()
            worker.result(timeout=30)
        browser.screenshot("group")
        # Back to the start of the topic: every message is lag again.
        page.get_by_label("Time", exact=True).fill("2000-01-01T00:00:00")
        page.get_by_role("button", name="Reset offsets").click()
        expect(page.locator(".notice.ok")).to_contain_text("queue offsets moved to 2000-01-01")
        expect(lag).not_to_have_text("0")
        assert int(lag.inner_text().replace(",", "")) >= 40
    finally:
        cluster.run(consumer.close)


def test_throughput_page_follows_the_produce_rate(cluster: Cluster, browser: BrowserSession) -> None:
    admin_call(cluster, "update_topic", "ticks", 2, 2, broker_name="broker-a")
    page = browser.page
    page.goto(f"{cluster.console}/throughput")
    stop = threading.Event()

    def produce() -> None:
        with Producer(cluster.namesrv) as p:
            while not stop.is_set():
                p.send_batch("ticks", [f"tick-{i}" for i in range(20)])
                time.sleep(0.1)

    worker = cluster.pool.submit(produce)
    try:
        produced = page.get_by_test_id("rate-ticks").locator("td.produce")
        expect(produced).not_to_have_text("0.0", timeout=10_000)
        assert float(produced.inner_text()) > 0
        expect(page.get_by_test_id("rate-ticks").locator("svg.spark").first).to_be_visible()
        browser.screenshot("throughput")
    finally:
        stop.set()
        worker.result(timeout=30)


def test_message_found_by_id_shows_its_body(cluster: Cluster, browser: BrowserSession) -> None:
    def produce():
        with Producer(cluster.namesrv) as p:
            return p.send("orders", "hello from the console test", keys=["order-42"], tags="created")

    sent = cluster.run(produce)
    page = browser.page
    page.goto(f"{cluster.console}/messages")
    page.get_by_label("Message id", exact=True).fill(sent.msg_id)
    page.get_by_role("button", name="Find").click()
    expect(page.get_by_test_id("message-body")).to_have_text("hello from the console test")
    expect(page.get_by_test_id("message")).to_contain_text("order-42")
    browser.screenshot("message")
    page.get_by_label("Message id", exact=True).fill("00" * 16)
    page.get_by_role("button", name="Find").click()
    expect(page.locator(".notice.error")).to_contain_text("MESSAGE_NOT_FOUND")


def test_a_message_found_by_key_shows_its_body_and_delivery_history(
    cluster: Cluster, browser: BrowserSession
) -> None:
    def produce_and_consume() -> str:
        with Producer(cluster.namesrv) as p:
            sent = p.send("orders", "refund for order 77", keys=["order-77"], tags="refund")
        with SimpleConsumer("billing", "orders", cluster.namesrv) as consumer:
            for _ in range(20):
                got = consumer.receive(16, 500)
                if got:
                    consumer.ack(*got)
                if any(m.msg_id == sent.msg_id for m in got):
                    return sent.msg_id
        raise AssertionError("billing never received the message")

    msg_id = cluster.run(produce_and_consume)
    page = browser.page
    page.goto(f"{cluster.console}/messages")
    by_key = page.get_by_role("region", name="By key")
    by_key.get_by_label("Topic").fill("orders")
    by_key.get_by_label("Key").fill("order-77")
    by_key.get_by_role("button", name="Search by key").click()
    results = page.get_by_test_id("search-results")
    expect(results.locator("tbody tr")).to_have_count(1)
    expect(results).to_contain_text("refund for order 77")
    results.get_by_role("link", name=msg_id).click()
    expect(page.get_by_test_id("message-body")).to_have_text("refund for order 77")
    billing = page.get_by_test_id("delivery-billing")
    expect(billing.locator("td.state")).to_have_text("ACKED")
    expect(billing.locator("ol.events li")).to_have_count(2)
    expect(billing.locator("ol.events li").nth(0)).to_contain_text("RECEIVED")
    expect(billing.locator("ol.events li").nth(1)).to_contain_text("ACKED")
    browser.screenshot("message-history")


def test_a_dead_letter_resent_from_the_page_is_delivered_again(
    cluster: Cluster, browser: BrowserSession
) -> None:
    admin_call(cluster, "update_topic", "payments", 1, 1, broker_name="broker-a")
    consumer = cluster.run(SimpleConsumer, "payer", "payments", cluster.namesrv)
    try:
        def poison() -> str:
            with Producer(cluster.namesrv) as p:
                p.send("payments", "poison pill")
            # Delivered, nacked, redelivered once (maxReconsumeTimes=1), nacked: then the DLQ.
            for _ in range(MAX_RECONSUME_TIMES + 1):
                got = consumer.receive(1, 3000)
                assert got and got[0].text == "poison pill"
                consumer.nack(*got)
            assert consumer.receive(1, 500) == []  # dead-lettered instead of a third delivery
            return "ok"

        cluster.run(poison)
        page = browser.page
        page.goto(f"{cluster.console}/groups/payer")
        dlq = page.get_by_test_id("dlq-table")
        expect(dlq.locator("tbody tr")).to_have_count(1)
        expect(dlq).to_contain_text("poison pill")
        expect(dlq).to_contain_text("payments")
        browser.screenshot("group-dead-letters")
        dlq.get_by_role("button", name="Resend").click()
        expect(page.locator(".notice.ok")).to_contain_text("resent to payments")
        again = cluster.run(consumer.receive, 1, 5000)
        assert [m.text for m in again] == ["poison pill"]
        assert again[0].reconsume_times == 0  # a new message, delivered afresh
        cluster.run(consumer.ack, *again)
    finally:
        cluster.run(consumer.close)


def test_topics_page_of_100_topics_costs_few_requests(cluster: Cluster, browser: BrowserSession) -> None:
    def create() -> None:
        with Admin(cluster.namesrv) as a:
            for i in range(100):
                a.update_topic(f"load-{i:03d}", 2, 2)

    cluster.run(create)
    page = browser.page
    seen: list[str] = []

    def record(req) -> None:
        seen.append(req.url)

    page.on("request", record)
    response = page.goto(f"{cluster.console}/topics")
    page.wait_for_load_state("load")
    page.remove_listener("request", record)
    backend = int(response.headers["x-console-backend-requests"])
    expect(page.locator("tbody tr[data-testid^='topic-load-']")).to_have_count(100)
    total = len(seen) + backend
    assert total <= MAX_REQUESTS_PER_PAGE_VIEW, (seen, backend)
    assert backend <= 3, "one name-server view and one bulk topic view per broker set"
    page.get_by_label("Filter topics").fill("load-04")
    expect(page.locator("tbody tr[data-testid^='topic-']:visible")).to_have_count(10)


def test_with_acl_the_console_asks_for_a_token_and_shows_what_it_may_read(
    cluster: Cluster, acl_cluster: AclCluster, browser: BrowserSession
) -> None:
    def setup() -> None:
        with Admin(acl_cluster.namesrv, token=ADMIN_TOKEN) as a:
            _wait_for_set(a)
            for topic, group in (("orders", "billing"), ("secret-payroll", "payroll-app")):
                a.update_topic(topic, 2, 2)
                a.reset_offset_by_time(group, topic, 0)

    cluster.run(setup)
    page = browser.new_page()
    page.goto(f"{acl_cluster.console}/topics")
    expect(page).to_have_url(re.compile(r"/login\?next=%2Ftopics$"))
    page.get_by_label("Access token").fill("not-a-token")
    page.get_by_role("button", name="Continue").click()
    expect(page.locator(".notice.error")).to_contain_text("do not know this token")
    page.get_by_label("Access token").fill(ORDERS_TOKEN)
    page.get_by_role("button", name="Continue").click()
    expect(page).to_have_url(f"{acl_cluster.console}/topics")
    expect(page.get_by_test_id("topic-orders")).to_be_visible()
    expect(page.get_by_test_id("topic-secret-payroll")).to_have_count(0)
    page.goto(f"{acl_cluster.console}/groups")
    expect(page.get_by_test_id("group-billing")).to_be_visible()
    expect(page.get_by_test_id("group-payroll-app")).to_have_count(0)
    page.goto(f"{acl_cluster.console}/acl")
    expect(page.locator("main tbody tr")).to_have_count(1)
    expect(page.locator("main tbody")).to_contain_text("orders-team")
    assert ORDERS_TOKEN not in page.content() and ADMIN_TOKEN not in page.content()
    browser.screenshot("acl", page)
    page.get_by_role("button", name="Log out").click()
    page.goto(f"{acl_cluster.console}/groups")
    expect(page).to_have_url(re.compile(r"/login"))
    page.context.close()


def _wait_for_set(admin: Admin, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            admin.broker_sets()
            return
        except LedgerMQError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_leadership_transfer_from_the_page(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    old = cluster.master_id()
    target = sorted(sid for sid in cluster.dledger if sid != old)[0]
    page.goto(f"{cluster.console}/cluster")
    page.get_by_role("button", name=f"Make {target} leader").click()
    expect(page.locator(".notice.ok")).to_contain_text(f"leadership handed to {target}")
    expect(page.get_by_test_id("master-broker-a")).to_have_text(target, timeout=10_000)
    assert cluster.master_id() == target


def test_killed_master_turns_red_and_a_new_one_shows_in_3s(cluster: Cluster, browser: BrowserSession) -> None:
    page = browser.page
    old = cluster.master_id()
    page.goto(f"{cluster.console}/cluster")
    expect(page.get_by_test_id("master-broker-a")).to_have_text(old)
    page.wait_for_timeout(1500)  # let the live refresh run at least once
    killed_at = time.monotonic()
    os.kill(cluster.group.procs[old].pid, signal.SIGKILL)
    dead_row = page.get_by_test_id(f"member-{cluster.dledger[old]}")
    expect(dead_row).to_have_class("down", timeout=3000)
    expect(dead_row).to_contain_text("DOWN")
    left_ms = max(100, int((killed_at + 3 - time.monotonic()) * 1000))
    expect(page.get_by_test_id("master-broker-a")).not_to_have_text(old, timeout=left_ms)
    elapsed = time.monotonic() - killed_at
    new = page.get_by_test_id("master-broker-a").inner_text()
    assert new in cluster.dledger and new != old
    assert elapsed < 3.0, f"the page showed the new master {elapsed:.2f} s after the kill"
    browser.screenshot("cluster-after-failover")
    cluster.group.procs[old].wait(5)


def test_no_request_left_loopback(browser: BrowserSession) -> None:
    assert browser.requests, "no request was recorded"
    assert not browser.refused, browser.refused
    outside = [u for u in browser.requests if not is_loopback(u)]
    assert not outside, outside
