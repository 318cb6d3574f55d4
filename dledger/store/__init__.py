"""DLedger stores: the mmap file store (production) and the memory store (simulation)."""
