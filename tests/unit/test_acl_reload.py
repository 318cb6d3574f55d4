"""The ACL file read again when it changes (`AccessControl.reload_if_changed`, real files): new
accounts and revoked tokens apply without a restart; a broken file keeps the accounts in force."""

from __future__ import annotations

import json
import logging
import os

import pytest

from broker.errors import BrokerError
from broker.service.acl import AccessControl


def _write(path, *tokens: str) -> None:
    path.write_text(json.dumps({"accounts": [{"name": t, "token": t, "admin": True} for t in tokens]}))


def _bump(path) -> None:
    """A later mtime even on a file system with coarse timestamps."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(tmp_path) -> None:
    f = tmp_path / "acl.json"
    _write(f, "old-token")
    acl = AccessControl.load(f)
    assert acl.reload_if_changed() is False
    _write(f, "old-token", "new-token")
    _bump(f)
    assert acl.reload_if_changed() is True
    assert acl.authenticate("Bearer new-token").name == "new-token"
    _write(f, "new-token")  # old-token revoked
    _bump(f)
    assert acl.reload_if_changed() is True
    with pytest.raises(BrokerError, match="unknown token"):
        acl.authenticate("Bearer old-token")


def test_a_broken_or_missing_file_keeps_the_accounts_and_is_logged_once(tmp_path, caplog) -> None:
    f = tmp_path / "acl.json"
    _write(f, "kept-token")
    acl = AccessControl.load(f)
    caplog.set_level(logging.INFO, logger="broker.service.acl")
    f.write_text('{"accounts": [{"name": "half')
    assert acl.reload_if_changed() is False
    assert acl.reload_if_changed() is False
    failures = [r.getMessage() for r in caplog.records if "event=acl_reload_failed" in r.getMessage()]
    assert len(failures) == 1 and str(f) in failures[0] and "keptAccounts=1" in failures[0], failures
    assert acl.authenticate("Bearer kept-token").name == "kept-token"

    f.write_text(json.dumps({"accounts": [{"name": "no-token"}]}))  # parses, but is refused too
    _bump(f)
    assert acl.reload_if_changed() is False
    f.unlink()
    assert acl.reload_if_changed() is False
    assert acl.authenticate("Bearer kept-token").name == "kept-token"

    _write(f, "kept-token", "fixed-token")
    assert acl.reload_if_changed() is True
    assert acl.authenticate("Bearer fixed-token").name == "fixed-token"


def test_acl_off_watches_nothing() -> None:
    acl = AccessControl.disabled()
    assert acl.path is None and acl.reload_if_changed() is False
