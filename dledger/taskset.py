"""`TaskSet`: a set of tasks/futures that iterates in insertion order.

A plain `set` of tasks iterates in address order, which differs from run to run; cancelling or
failing them in that order would make simulator runs irreproducible.
"""

from __future__ import annotations

from typing import Any


class TaskSet(dict[Any, None]):
    """Insertion-ordered set with `add` / `discard` (usable as a done-callback)."""

    def add(self, item: Any) -> None:
        self[item] = None

    def discard(self, item: Any) -> None:
        self.pop(item, None)
