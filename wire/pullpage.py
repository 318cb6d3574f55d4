"""The binary pull page (`Accept: application/x-ledgermq-messages` or `?format=binary` on a pull):
one definition of the format for the broker that writes it (`broker.http.codec`) and the two
readers, the SDK (`client.received`, objects per message) and the Spark source
(`pipeline.binpull`, columns per page). docs/INTERFACES.md, "Binary pull format", is the contract.

All integers big-endian. A page is::

    header  HEADER (36 bytes)
      0  4s  magic          b"LMQP"
      4  B   version        1
      5  3x  reserved       zero
      8  I   count          messages in the page
     12  q   nextOffset     \\
     20  q   minOffset       } as in the JSON form
     28  q   maxOffset      /
    count records, each RECORD (57 bytes) followed by its variable fields
      0  q   queueOffset
      8  q   commitLogOffset
     16  q   bornTimestamp  (ms)
     24  q   storeTimestamp (ms)
     32  i   reconsumeTimes
     36  i   queueId
     40  B   msgIdLen       then msgIdLen bytes: the msgId, ASCII hex
     41  i   tagsLen        then tagsLen bytes of UTF-8 tags; -1 = no tags (JSON null)
     45  I   keysLen        then keysLen bytes: the KEYS property, UTF-8, keys separated by " "
     49  I   propsLen       then propsLen bytes: user properties as raw `k\\x01v\\x02...` (UTF-8)
     53  I   bodyLen        (the body itself is in the body section)
    body section: the count bodies, concatenated in record order, and nothing after them.

Bodies sit together at the end so a reader can wrap them as one Arrow binary buffer without a
copy per row. The JSON form's `topic` and `bodyEncoding` are not sent (the topic is in the URL;
bodies are always raw bytes).
"""

from __future__ import annotations

import struct

CONTENT_TYPE = "application/x-ledgermq-messages"
MAGIC = b"LMQP"
VERSION = 1
HEADER = struct.Struct(">4sB3xIqqq")
RECORD = struct.Struct(">qqqqiiBiIII")
# Within a record, the four lengths that decide where the next record starts: msgIdLen, tagsLen,
# keysLen, propsLen (a reader that only walks the records unpacks these alone).
LENGTHS = struct.Struct(">BiII")
LENGTHS_AT = 40
assert HEADER.size == 36 and RECORD.size == 57 and LENGTHS_AT + LENGTHS.size == RECORD.size - 4


def parse_properties(raw: bytes) -> list[tuple[str, str]]:
    """A record's user properties, `k\\x01v\\x02...`, as [(k, v), ...] in page order. ValueError
    (naming what is wrong) for bytes that are not that: bad UTF-8, no final `\\x02`, an entry
    without `\\x01` or with an empty name."""
    if not raw:
        return []
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"properties are not valid UTF-8 ({exc.reason})") from None
    if not text.endswith("\x02"):
        raise ValueError("properties do not end with \\x02")
    out = []
    for item in text[:-1].split("\x02"):
        k, sep, v = item.partition("\x01")
        if not sep or not k:
            raise ValueError(f"property entry {item[:40]!r} is not key\\x01value")
        out.append((k, v))
    return out
