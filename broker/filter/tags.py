"""Tag expressions (RocketMQ `ExpressionType.TAG`): `TagA || TagB`, or `*` for every message.

As RocketMQ's `FilterAPI.buildSubscriptionData`: `null`, empty and `*` subscribe to all; otherwise
the expression is split on `||`, each part trimmed, empty parts dropped. A message matches when its
TAGS property is one of the tags (a message without tags matches only `*`). The consume-queue unit
holds the tag's Java `String.hashCode()`, so a unit whose code is not one of the tags' codes is
skipped without reading the message; the tag string itself is then compared, so a hash collision
never lets a non-matching message through (RocketMQ leaves that last check to the client).
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.filter.errors import FilterError
from broker.message import PROPERTY_TAGS, tags_hash_code

SUB_ALL = "*"
MAX_TAG_EXPRESSION_LENGTH = 4096


def parse_tags(expression: str | None) -> frozenset[str] | None:
    """The tag set of an expression; None = every message. FilterError when no tag is left."""
    if expression is None:
        return None
    if not isinstance(expression, str):
        raise FilterError(f"tag expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_TAG_EXPRESSION_LENGTH:
        raise FilterError(f"tag expression is {len(expression)} characters, "
                          f"at most {MAX_TAG_EXPRESSION_LENGTH}")
    text = expression.strip()
    if not text or text == SUB_ALL:
        return None
    tags = frozenset(t.strip() for t in text.split("||") if t.strip())
    if not tags:
        raise FilterError(f"tag expression {expression!r} names no tag (use '*' for all)")
    return tags


class TagFilter:
    """Matches messages whose TAGS property is one of `tags` (None: every message)."""

    __slots__ = ("codes", "expression", "match_all", "tags")

    def __init__(self, expression: str | None) -> None:
        self.expression = SUB_ALL if expression is None or not expression.strip() else expression
        self.tags = parse_tags(expression)
        self.match_all = self.tags is None
        self.codes = frozenset(tags_hash_code(t) for t in self.tags) if self.tags is not None else None

    @property
    def expression_type(self) -> str:
        return "TAG"

    def accepts_code(self, tags_code: int) -> bool:
        """The consume-queue pre-check: could a unit with this tags code match?"""
        return self.codes is None or tags_code in self.codes

    def matches_tag(self, tag: str | None) -> bool:
        return self.tags is None or tag in self.tags

    def matches(self, properties: Mapping[str, str]) -> bool:
        return self.tags is None or properties.get(PROPERTY_TAGS) in self.tags
