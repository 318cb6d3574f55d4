"""DLedger: a Raft-replicated log (our Python port of openmessaging DLedger).

This package knows nothing about messages or HTTP; the broker uses it through `DLedgerServer`
and the store API.
"""
