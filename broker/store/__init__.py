"""LedgerMQ broker/store package."""
