"""LedgerMQ client package."""
