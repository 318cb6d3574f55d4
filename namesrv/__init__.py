"""LedgerMQ namesrv package."""
