"""LedgerMQ pipeline package."""
