"""`mqdashboard`: a web console for LedgerMQ operators (cluster, Raft state, topics, groups,
messages), over the name servers' and brokers' public HTTP APIs through the SDK's admin client.
Nothing in the broker or name server imports it."""
