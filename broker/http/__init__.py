"""LedgerMQ broker/http package."""
