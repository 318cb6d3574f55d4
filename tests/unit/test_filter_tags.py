"""Tag expressions: RocketMQ's `TagA || TagB` and `*`, with the consume-queue hash pre-check."""

import pytest

from broker.filter import MATCH_ALL, FilterError, build_filter
from broker.filter.tags import TagFilter, parse_tags
from broker.message import tags_hash_code


def test_star_empty_and_none_subscribe_to_everything():
    for expr in (None, "", "  ", "*", " * "):
        f = build_filter("TAG", expr, False)
        assert f.match_all and f.accepts_code(12345) and f.matches({}) and f.matches({"TAGS": "x"})
    assert build_filter(None, None, False) is MATCH_ALL


def test_or_list_is_split_and_trimmed():
    assert parse_tags("TagA || TagB||TagC ") == frozenset({"TagA", "TagB", "TagC"})
    assert parse_tags("TagA || || TagB") == frozenset({"TagA", "TagB"})
    f = TagFilter("TagA || TagB")
    assert f.matches({"TAGS": "TagB"}) and not f.matches({"TAGS": "TagC"})
    assert not f.matches({})  # a message without tags matches only '*'
    assert f.accepts_code(tags_hash_code("TagA")) and not f.accepts_code(tags_hash_code("TagC"))


def test_hash_collision_is_caught_by_the_string_check():
    # "Aa" and "BB" have the same Java String.hashCode: the unit passes, the message does not
    assert tags_hash_code("Aa") == tags_hash_code("BB")
    f = TagFilter("Aa")
    assert f.accepts_code(tags_hash_code("BB")) and not f.matches({"TAGS": "BB"})


def test_expression_naming_no_tag_is_refused():
    for bad in ("||", " || ", "x" * 5000):
        with pytest.raises(FilterError):
            TagFilter(bad)
