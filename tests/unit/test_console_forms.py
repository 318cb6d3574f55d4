"""Whatever an operator (or a hand-edited URL) puts in the console's forms and query strings, the
console answers with a page or a redirect carrying the error — never a 500. The cluster behind it
is a name-server address where nothing listens, so the inputs that pass the console's own checks
also exercise "the cluster does not answer" (an error in the page, not a crash)."""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import quote, unquote, urlencode

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.app import FLASH_COOKIE, create_app
from tests.ports import free_port

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
FORM = {"Content-Type": "application/x-www-form-urlencoded"}

# Values a datetime-local input, a hidden tzOffsetMin field or a hand-made URL may carry.
times = st.one_of(
    st.sampled_from(
        ["2024-01-01T00:00", "9999-12-31T23:59", "0001-01-01T00:00", "2024-13-01T00:00", "x", ""]
    ),
    st.datetimes().map(lambda d: d.isoformat(timespec="minutes")),
    st.text(max_size=20),
)
offsets = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(["", "-0", "1e3", "nan", "300"]),
    st.text(max_size=8),
)
names = st.one_of(st.sampled_from(["demo", "", "%DLQ%g", "a" * 300, "RMQ_SYS_X"]), st.text(max_size=30))
numbers = st.one_of(st.integers(-(2**70), 2**70).map(str), st.text(max_size=6))


@pytest.fixture(scope="module")
def console() -> Iterator[TestClient]:
    # Nothing listens there: every call the console makes to the cluster is refused at once.
    with TestClient(create_app(f"127.0.0.1:{free_port()}"), follow_redirects=False) as client:
        yield client


def notice(response) -> str:
    return unquote(response.cookies.get(FLASH_COOKIE, ""))


def test_an_overflowing_time_zone_offset_is_a_form_error(console: TestClient) -> None:
    """A tzOffsetMin beyond any zone used to overflow timedelta and answer 500."""
    body = urlencode({"topic": "demo", "time": "2024-01-01T00:00", "tzOffsetMin": "99999999999999"})
    r = console.post("/groups/g1/reset-offset", content=body, headers=FORM)
    assert r.status_code == 303, r.text
    assert notice(r).startswith("error|tzOffsetMin:"), notice(r)
    r = console.get(
        "/messages?"
        + urlencode(
            {"topic": "demo", "queueId": 0, "begin": "2024-01-01T00:00", "tzOffsetMin": "99999999999999"}
        )
    )
    assert r.status_code == 200 and "tzOffsetMin:" in r.text


def test_the_last_minute_of_year_9999_east_of_utc_is_a_form_error(console: TestClient) -> None:
    body = urlencode({"topic": "demo", "time": "9999-12-31T23:59", "tzOffsetMin": "600"})
    r = console.post("/groups/g1/reset-offset", content=body, headers=FORM)
    assert r.status_code == 303 and notice(r).startswith("error|time:"), notice(r)


def _segment(name: str) -> str:
    """`name` as one path segment. "." and ".." are dot segments: every client (httpx, a browser)
    removes them from the path before sending, so no request can carry them as a group (nor can
    a group have a dot in its name); an empty name would drop the segment."""
    return "g" if name in ("", ".", "..") else quote(name, safe="")


@FUZZ
@given(group=names, topic=names, when=times, tz=offsets)
def test_reset_offset_form_never_fails_the_console(console: TestClient, group, topic, when, tz) -> None:
    body = urlencode({"topic": topic, "time": when, "tzOffsetMin": tz})
    r = console.post(f"/groups/{_segment(group)}/reset-offset", content=body, headers=FORM)
    assert r.status_code in (303, 404), r.text[:300]


@FUZZ
@given(topic=names, key=names, queue=numbers, begin=times, end=times, tz=offsets, max_=numbers, msg_id=names)
def test_message_search_never_fails_the_console(
    console: TestClient, topic, key, queue, begin, end, tz, max_, msg_id
) -> None:
    query = {
        "topic": topic,
        "key": key,
        "queueId": queue,
        "begin": begin,
        "end": end,
        "tzOffsetMin": tz,
        "maxMessages": max_,
    }
    r = console.get("/messages?" + urlencode(query))
    assert r.status_code == 200, r.text[:300]
    r = console.get("/messages?" + urlencode({"msgId": msg_id}))
    assert r.status_code == 200, r.text[:300]


@FUZZ
@given(topic=names, read=numbers, write=numbers, perm=numbers, broker=names, transferee=names)
def test_admin_forms_never_fail_the_console(
    console: TestClient, topic, read, write, perm, broker, transferee
) -> None:
    body = urlencode({"topic": topic, "readQueueNums": read, "writeQueueNums": write, "perm": perm})
    assert console.post("/topics", content=body, headers=FORM).status_code == 303
    body = urlencode({"brokerName": broker, "transfereeId": transferee})
    assert console.post("/cluster/leadership-transfer", content=body, headers=FORM).status_code == 303
    body = urlencode({"msgId": transferee})
    path = f"/groups/{_segment(topic)}/dlq/resend"
    assert console.post(path, content=body, headers=FORM).status_code in (303, 404)


def test_an_unknown_address_is_a_page_with_the_navigation(console: TestClient) -> None:
    r = console.get("/nope")
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert 'href="/cluster"' in r.text and "GET /nope: Not Found" in r.text
    r = console.post("/cluster", content=b"", headers=FORM)
    assert r.status_code == 405 and "POST /cluster: Method Not Allowed" in r.text
