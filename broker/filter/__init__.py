"""Message filters as RocketMQ defines them: tag expressions and SQL92 property selectors.

`build_filter(type, expression, enable_property_filter)` gives a `MessageFilter`: the store checks
`accepts_code(unit tags code)` on each consume-queue unit (skipping the read when it cannot match)
and then `matches(properties)` on the stored message, so a non-matching message is never returned.
A filtered-out message still counts as read: pull's next offset and group consumption's committed
offset move past it. Pull, group receive, the gRPC endpoint and the Spark source all take the same
`FilterExpression`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from broker.filter.errors import FilterError
from broker.filter.sql92 import SqlFilter
from broker.filter.tags import SUB_ALL, TagFilter

__all__ = ["MATCH_ALL", "ExpressionType", "FilterError", "FilterExpression", "MessageFilter", "SqlFilter",
           "TagFilter", "build_filter"]


class ExpressionType(StrEnum):
    """RocketMQ's `ExpressionType` (gRPC `FilterType` TAG / SQL)."""

    TAG = "TAG"
    SQL92 = "SQL92"

    @classmethod
    def parse(cls, value: str | None) -> ExpressionType:
        """TAG for None/empty (RocketMQ's default); `SQL` is accepted as gRPC spells it."""
        if value is None or value == "":
            return cls.TAG
        text = str(value).strip().upper()
        if text == "SQL":
            return cls.SQL92
        try:
            return cls(text)
        except ValueError:
            raise FilterError(f"filter type must be TAG or SQL92, got {value!r}") from None


class MessageFilter(Protocol):
    """What the store and the consumers' services ask of a filter."""

    expression: str
    match_all: bool  # True: every message matches (no need to read properties)

    @property
    def expression_type(self) -> str: ...

    def accepts_code(self, tags_code: int) -> bool:
        """Could a consume-queue unit with this tags code match? (False: skip without reading.)"""
        ...

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Does the stored message with these properties (TAGS, KEYS and user ones) match?"""
        ...


MATCH_ALL = TagFilter(SUB_ALL)


@dataclass(frozen=True, slots=True)
class FilterExpression:
    """A subscription's filter as the wire carries it (HTTP `filterType`/`filterExpression`,
    gRPC `FilterExpression{type, expression}`)."""

    type: ExpressionType = ExpressionType.TAG
    expression: str = SUB_ALL

    def build(self, enable_property_filter: bool) -> MessageFilter:
        return build_filter(self.type, self.expression, enable_property_filter)


def build_filter(expression_type: ExpressionType | str | None, expression: str | None,
                 enable_property_filter: bool) -> MessageFilter:
    """A filter for `expression`; FilterError if it does not parse, or if it is SQL92 and the
    broker runs with `enablePropertyFilter=false` (RocketMQ refuses such subscriptions too)."""
    kind = ExpressionType.parse(expression_type)
    if kind is ExpressionType.TAG:
        if expression is None or expression.strip() in ("", SUB_ALL):
            return MATCH_ALL
        return TagFilter(expression)
    if not enable_property_filter:
        raise FilterError("SQL92 filters need enablePropertyFilter=true on the broker")
    if not isinstance(expression, str):
        raise FilterError("SQL92 expression is missing")
    return SqlFilter(expression)
