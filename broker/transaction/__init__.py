"""Transactional messages: half messages, commit/rollback replicated through the log, and the
check-back to the producer group (see `state.py` and `service.py`)."""
