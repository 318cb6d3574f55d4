"""mqadmin's tables: rich on a terminal, plain aligned columns through a pipe."""

from __future__ import annotations

import io
import re

from client.mqadmin import print_table

ROWS = [
    {"brokerName": "broker-a", "queueId": 0, "maxOffset": 12345, "masterAddr": None},
    {"brokerName": "broker-a", "queueId": 1, "maxOffset": 7, "masterAddr": "127.0.0.1:10911"},
]


def test_a_pipe_gets_plain_columns_header_first() -> None:
    out = io.StringIO()  # not a terminal
    print_table(ROWS, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["brokerName", "queueId", "maxOffset", "masterAddr"]
    assert lines[1].split() == ["broker-a", "0", "12345"]
    assert lines[2].split() == ["broker-a", "1", "7", "127.0.0.1:10911"]


def test_a_terminal_gets_a_rich_table_with_numbers_right_aligned() -> None:
    out = io.StringIO()
    print_table(ROWS, out=out, fancy=True)
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.getvalue())  # drop the colour codes
    assert "┃" in text and "│" in text  # borders
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert len(body) == 2
    cells = [c.strip() for c in body[1].strip("│").split("│")]
    assert cells == ["broker-a", "1", "7", "127.0.0.1:10911"]
    # right-aligned: the short number ends where the long one does
    assert body[0].index("12345") + len("12345") == body[1].index(" 7 ") + 2


def test_no_rows_says_none() -> None:
    out = io.StringIO()
    print_table([], out=out, fancy=True)
    assert out.getvalue() == "(none)\n"
