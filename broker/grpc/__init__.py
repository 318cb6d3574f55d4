"""RocketMQ 5 gRPC endpoint (apache/rocketmq-apis v2 `MessagingService`): the official RocketMQ
clients (Java, Go, Python, Node.js, ...) talk to a LedgerMQ broker as they talk to RocketMQ's
proxy in "local" mode.

A thin front-end over the broker's services (`broker.service`), like `broker.http`: each RPC
converts the protobuf request into the services' typed values, calls one service and converts the
result or `BrokerError` back (`Code` statuses from `status.py`). No rule of produce, pop/ack,
offsets or ACL lives here; what does is what only this protocol has: the Telemetry settings
handshake (`settings.py`), routes with gRPC endpoints
(`route.py`), the access-key signature (`auth.py`), server-side invisibility renewal for push
consumers (`renewal.py`) and calls a slave forwards to its master (`forward.py`).
"""
