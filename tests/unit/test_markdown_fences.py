"""The README and docs/ render as written: every fenced code block closes. A closing fence with
text after it is no fence in CommonMark, so the block runs on and swallows the prose after it
(the README's SDK section once did)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FENCE = "`" * 3
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fence_problems(text: str) -> list[str]:
    """Lines that break the fenced blocks of `text`: a would-be closing fence with text after
    it, and a block still open at the end."""
    problems = []
    open_at = 0
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s.startswith(FENCE):
            continue
        if not open_at:
            open_at = n
        elif s == FENCE:
            open_at = 0
        else:
            problems.append(f"line {n}: text after the fence that should close the block of line {open_at}")
    if open_at:
        problems.append(f"the block opened at line {open_at} never closes")
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_code_block_closes(path: Path) -> None:
    assert fence_problems(path.read_text()) == []


def test_the_check_finds_a_fence_with_text_after_it() -> None:
    broken = f"{FENCE}python\nx = 1\n{FENCE} and then prose\nmore prose\n"
    assert fence_problems(broken) == [
        "line 3: text after the fence that should close the block of line 1",
        "the block opened at line 1 never closes",
    ]
    assert fence_problems(f"{FENCE}python\nx = 1\n{FENCE}\nprose\n") == []
