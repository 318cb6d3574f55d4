"""Offset planning of the ``ledgermq`` source: pure functions, no Spark, no broker."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.offsets import (
    OffsetSpecError,
    QueueState,
    backlog,
    cap_to,
    find_data_loss,
    find_rewound,
    merge_latest,
    offsets_to_json,
    parse_queue_key,
    plan_ranges,
    rate_limit,
    resolve_spec,
    sort_offsets,
    states_to_offsets,
)

STATES = [
    QueueState("t", "broker-a", 0, 0, 10),
    QueueState("t", "broker-a", 1, 5, 7),
    QueueState("t", "broker-a", 10, 0, 3),
    QueueState("t", "broker-a", 2, 0, 0),
]


def test_queue_key_round_trip_with_colon_in_broker_name():
    assert parse_queue_key("dc:1:broker-a:12") == ("dc:1:broker-a", 12)
    with pytest.raises(OffsetSpecError):
        parse_queue_key("broker-a")
    with pytest.raises(OffsetSpecError):
        parse_queue_key("broker-a:x")


def test_offsets_json_is_sorted_numerically_by_queue_and_stable():
    a = {"t": {"broker-a:10": 1, "broker-a:2": 2}, "a": {"b:0": 0}}
    b = {"a": {"b:0": 0}, "t": {"broker-a:2": 2, "broker-a:10": 1}}
    assert offsets_to_json(a) == offsets_to_json(b) == '{"a":{"b:0":0},"t":{"broker-a:2":2,"broker-a:10":1}}'
    # The sorted dict itself (what Spark's runner json.dumps) has the same stable key order.
    assert json.dumps(sort_offsets(a)) == json.dumps(sort_offsets(b))


def test_earliest_and_latest_specs():
    assert resolve_spec("earliest", STATES, "startingOffsets", default_missing="earliest") == {
        "t": {"broker-a:0": 0, "broker-a:1": 5, "broker-a:2": 0, "broker-a:10": 0}
    }
    assert resolve_spec(" LATEST ", STATES, "startingOffsets", default_missing="earliest") == {
        "t": {"broker-a:0": 10, "broker-a:1": 7, "broker-a:2": 0, "broker-a:10": 3}
    }


def test_json_spec_with_sentinels_and_missing_queues():
    spec = '{"t": {"broker-a:0": 4, "broker-a:1": -2, "broker-a:10": -1}, "u": {"broker-b:0": 9}}'
    got = resolve_spec(spec, STATES, "startingOffsets", default_missing="earliest")
    assert got == {
        "t": {"broker-a:0": 4, "broker-a:1": 5, "broker-a:2": 0, "broker-a:10": 3},
        "u": {"broker-b:0": 9},  # not on the broker (yet): kept as given
    }
    ending = resolve_spec('{"t": {"broker-a:0": 6}}', STATES, "endingOffsets", default_missing="latest")
    assert ending["t"] == {"broker-a:0": 6, "broker-a:1": 7, "broker-a:2": 0, "broker-a:10": 3}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("soonest", "not 'earliest', 'latest' or valid JSON"),
        ("[1]", "JSON must be an object"),
        ('{"t": 3}', "must be an object of queue offsets"),
        ('{"t": {"broker-a:0": -3}}', "must be an integer >= 0"),
        ('{"t": {"broker-a:0": true}}', "must be an integer >= 0"),
        ('{"t": {"broker-a:0": "5"}}', "must be an integer >= 0"),
        ('{"t": {"0": 5}}', "bad queue key"),
    ],
)
def test_bad_specs_name_the_problem(spec, needle):
    with pytest.raises(OffsetSpecError, match="startingOffsets") as info:
        resolve_spec(spec, STATES, "startingOffsets", default_missing="earliest")
    assert needle in str(info.value)


def test_merge_latest_new_queue_starts_at_zero_and_never_moves_back():
    start = {"t": {"b:0": 5, "b:1": 9}}
    available = {"t": {"b:0": 8, "b:1": 4, "b:2": 3}}  # b:1 behind start (stale replica) → stays at 9
    assert merge_latest(start, available) == {"t": {"b:0": 8, "b:1": 9, "b:2": 3}}
    # a broker set unreachable this round keeps its queues at start
    assert merge_latest(start, {"t": {"b:0": 8}}) == {"t": {"b:0": 8, "b:1": 9}}


def test_rate_limit_is_max_min_fair_and_exact():
    start = {"t": {"b:0": 0, "b:1": 100, "b:2": 0, "b:3": 0}}
    latest = {"t": {"b:0": 1000, "b:1": 103, "b:2": 10, "b:3": 1000}}
    got = rate_limit(start, latest, 100)
    # b:1 needs 3, b:2 needs 10: they are drained; the other two share the rest evenly.
    assert got == {"t": {"b:0": 43, "b:1": 103, "b:2": 10, "b:3": 44}} or got == {
        "t": {"b:0": 44, "b:1": 103, "b:2": 10, "b:3": 43}
    }
    assert backlog(start, got) == 100
    # deterministic
    assert rate_limit(start, latest, 100) == got


def test_rate_limit_fewer_rows_than_queues():
    start = {"t": {"b:0": 0, "b:1": 0, "b:2": 0}}
    latest = {"t": {"b:0": 5, "b:1": 5, "b:2": 5}}
    assert rate_limit(start, latest, 2) == {"t": {"b:0": 1, "b:1": 1, "b:2": 0}}
    with pytest.raises(ValueError):
        rate_limit(start, latest, 0)


offsets_st = st.dictionaries(
    st.sampled_from(["b:0", "b:1", "b:2", "c:0", "c:7"]), st.integers(0, 500), min_size=1
)


@given(offsets_st, offsets_st, st.integers(1, 3000))
def test_rate_limit_properties(start_q, avail_q, max_rows):
    start = {"t": start_q}
    latest = merge_latest(start, {"t": avail_q})
    got = rate_limit(start, latest, max_rows)
    assert backlog(start, got) == min(max_rows, backlog(start, latest))
    for key, off in got["t"].items():
        assert start_q.get(key, 0) <= off <= latest["t"][key]
    # No queue gets more than one unit above a queue that was cut short (max-min fairness).
    granted = {k: off - start_q.get(k, 0) for k, off in got["t"].items()}
    short = [granted[k] for k in got["t"] if got["t"][k] < latest["t"][k]]
    if short:
        assert max(granted.values()) <= min(short) + 1


def test_cap_to_available_now_target():
    start = {"t": {"b:0": 2, "b:1": 0}}
    offsets = {"t": {"b:0": 9, "b:1": 9, "b:2": 4}}
    target = {"t": {"b:0": 5, "b:1": 20}}
    assert cap_to(offsets, target, start) == {"t": {"b:0": 5, "b:1": 9, "b:2": 0}}


def test_plan_ranges_one_per_queue_with_data_in_order():
    start = {"t": {"b:0": 2, "b:1": 4, "b:10": 0}}
    end = {"t": {"b:10": 3, "b:1": 4, "b:0": 5, "b:2": 1}}
    ranges = plan_ranges(start, end)
    assert [(r.broker_name, r.queue_id, r.start, r.end) for r in ranges] == [
        ("b", 0, 2, 5),
        ("b", 2, 0, 1),
        ("b", 10, 0, 3),
    ]
    assert plan_ranges(end, end) == []


def test_find_data_loss_reports_deleted_offsets():
    states = [QueueState("t", "b", 0, 100, 200), QueueState("t", "b", 1, 0, 50)]
    problems = find_data_loss({"t": {"b:0": 40, "b:1": 10}}, states)
    assert problems == ["t/b:0: next offset 40 < earliest available 100 (60 messages lost)"]
    assert find_data_loss({"t": {"b:0": 100}}, states) == []
    assert find_data_loss({"t": {"b:1": 60}}, states) == []
    assert find_rewound({"t": {"b:0": 150, "b:1": 60}}, states) == [
        "t/b:1: next offset 60 > latest available 50"
    ]


def test_states_to_offsets_rejects_unknown_use():
    with pytest.raises(ValueError):
        states_to_offsets(STATES, use="middle")
