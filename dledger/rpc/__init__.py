"""Node-to-node RPC: protocol types, TCP transport and the in-memory network for tests."""
