"""LedgerMQ broker package."""
