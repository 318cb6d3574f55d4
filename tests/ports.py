"""Free loopback ports for the servers a test starts."""

from __future__ import annotations

import socket

# Ports handed out earlier in this test process: a server may not have bound its port yet when
# the next one is asked for, and the kernel may offer the same ephemeral port again.
_given: set[int] = set()


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 right now, none handed out before in this process."""
    out: list[int] = []
    held: list[socket.socket] = []
    try:
        while len(out) < n:
            s = socket.socket()
            held.append(s)  # kept bound until all are chosen, so the kernel never repeats one
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            if port not in _given:
                out.append(port)
        _given.update(out)
        return out
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    """One port free on 127.0.0.1 right now."""
    return free_ports(1)[0]
