"""Every HTTP port of a LedgerMQ process (broker, name server, broker container) is a `listener`:
TLS from the operator's certificate files, bounded read deadlines, connection caps per listener and
per client IP, one table of `.properties` keys for all of them (`listener.config`).

It imports nothing of ours but the wire vocabulary, so the broker and the name server share it
without sharing each other's code."""
