"""LedgerMQ's wire vocabulary, shared by the broker, the name server and the clients: the error
codes with their HTTP status and title (`codes`), the RFC 9457 problem body (`problem`), offset
message ids (`msgid`), request-body limits (`limits`), name patterns (`names`), the binary pull
page (`pullpage`) and a FIFO message group's queue (`groups`).

It imports nothing of ours, so every side can depend on it without depending on another side.
"""
