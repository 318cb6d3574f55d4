"""Run by an official Python client of any version (its own venv): a producer sends N messages,
a simple consumer receives and acks them all; prints one JSON line with what happened.

usage: python py_roundtrip.py ENDPOINTS TOPIC GROUP N [tls] [ak=ACCESS_KEY sk=SECRET_KEY]
(tls: the clients' tls_enable=True; ak/sk: their Credentials, an ACL account's name and token)
"""

import json
import sys
import time

from rocketmq import ClientConfiguration, Credentials, FilterExpression, Message, Producer, SimpleConsumer


def main() -> None:
    endpoints, topic, group, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = dict(a.split("=", 1) if "=" in a else (a, "") for a in sys.argv[5:])
    tls = "tls" in extra
    credentials = Credentials(extra["ak"], extra["sk"]) if "ak" in extra else Credentials()
    config = ClientConfiguration(endpoints, credentials)
    producer = Producer(config, (topic,), tls_enable=tls)
    producer.startup()  # 5.1.1 waits here for the server's Settings
    sent = {}
    try:
        for i in range(n):
            msg = Message()
            msg.topic = topic
            msg.body = f"py-{i}".encode()
            msg.tag = "roundtrip"
            msg.keys = f"key-{i}"
            msg.add_property("seq", str(i))
            sent[producer.send(msg).message_id] = i
    finally:
        producer.shutdown()
    consumer = SimpleConsumer(config, group, {topic: FilterExpression()}, await_duration=5, tls_enable=tls)
    consumer.startup()
    received = {}
    try:
        deadline = time.monotonic() + 60
        while len(received) < n and time.monotonic() < deadline:
            for m in consumer.receive(32, 30):
                received[m.message_id] = {
                    "body": m.body.decode(),
                    "tag": m.tag,
                    "keys": sorted(m.keys),
                    "seq": m.properties.get("seq"),
                    "attempt": m.delivery_attempt,
                }
                consumer.ack(m)
    finally:
        consumer.shutdown()
    print(json.dumps({"sent": sent, "received": received}))


if __name__ == "__main__":
    main()
