"""The RFC 9457 `application/problem+json` body every LedgerMQ HTTP error answer carries:

{"type": "https://ledgermq.dev/problems/<CODE>", "title", "status", "detail", "code": "<CODE>",
 ...extra members (masterAddr, field, minOffset, limit, outcome, ...)}
"""

from __future__ import annotations

from typing import Any

from wire.codes import ErrorCode

PROBLEM_TYPE_BASE = "https://ledgermq.dev/problems/"
PROBLEM_CONTENT_TYPE = "application/problem+json"


def problem_body(code: ErrorCode, detail: str, status: int | None = None, **extra: Any) -> dict[str, Any]:
    """The problem document of `code` (its status unless `status` says otherwise); `extra`
    members are added as they are, None values left out."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + code.value,
        "title": code.title,
        "status": status or code.status,
        "detail": detail,
        "code": code.value,
    }
    for key, value in extra.items():
        if value is not None:
            body[key] = value
    return body
