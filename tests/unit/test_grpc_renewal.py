"""Server-side invisibility renewal of the gRPC endpoint (push consumers' `auto_renew`)."""

from __future__ import annotations


async def test_renewal_lets_go_of_a_silent_clients_messages(monkeypatch) -> None:
    """A push consumer that stops calling (killed) no longer holds its messages: renewal of its
    handles stops, so they reappear for the group at their current deadline."""
    from broker.grpc import renewal

    calls = []

    class Pop:
        async def change_invisible(self, account, group, topic, handle, ms):
            calls.append(handle)
            return handle + "'"

    now = [1_000_000]
    monkeypatch.setattr(renewal, "_now_ms", lambda: now[0])
    r = renewal.InvisibilityRenewer(Pop())
    r.track("g", "t", "h1", "alive", None)
    r.track("g", "t", "h2", "killed", None)
    now[0] += renewal.AUTO_RENEW_INVISIBLE_MS - renewal.RENEW_AHEAD_MS
    r.seen("alive")
    for key in list(r._renewals):
        await r._renew(key)
    assert sorted(calls) == ["h1", "h2"] and r.current("g", "t", "h1") == "h1'"
    now[0] += renewal.CLIENT_SILENT_MS + 1
    r.seen("alive")
    r.expire_silent()
    assert r.current("g", "t", "h2") == "h2" and len(r) == 1
