"""The one error of the filter package (the service layer maps it to ILLEGAL_FILTER_EXPRESSION)."""

from __future__ import annotations


class FilterError(ValueError):
    """A filter expression that cannot be used: it does not parse, or its type is not supported
    (SQL92 while `enablePropertyFilter=false`). The message says why and where."""
