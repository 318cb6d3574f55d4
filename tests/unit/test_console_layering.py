"""The console is a client: nothing of the servers, the SDK or DLedger imports it, and the offline
docs helper the servers use imports nothing of ours (so a server never pulls in the console)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = {"dledger", "broker", "namesrv", "client", "pipeline", "console", "apidocs"}


def imported_packages(package: str) -> dict[str, set[str]]:
    """Module file → the top-level packages of ours it imports."""
    out = {}
    for path in sorted((REPO / package).rglob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(REPO))] = names & OURS
    return out


@pytest.mark.parametrize("package", ["dledger", "broker", "namesrv", "client", "pipeline"])
def test_no_server_or_sdk_module_imports_the_console(package: str) -> None:
    offenders = {f: n for f, n in imported_packages(package).items() if "console" in n}
    assert not offenders, offenders


def test_the_docs_helper_imports_nothing_of_ours() -> None:
    offenders = {f: n for f, n in imported_packages("apidocs").items() if n - {"apidocs"}}
    assert not offenders, offenders


def test_the_console_reaches_the_cluster_only_through_the_sdk() -> None:
    offenders = {f: n for f, n in imported_packages("console").items() if n - {"console", "client"}}
    assert not offenders, offenders
