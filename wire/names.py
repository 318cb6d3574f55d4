"""Name rules every side checks the same way (RocketMQ's): topics, consumer groups and broker
names are 1-127 (groups 1-255) characters of `[%|a-zA-Z0-9_-]` — no `/` and no `.`, so a name can
never name a path outside the store's directories. Patterns are anchored JSON-schema regexes (the
OpenAPI document publishes them as they are)."""

from __future__ import annotations

import re

NAME_CHARS = r"[%|a-zA-Z0-9_-]"
MAX_TOPIC_LENGTH = 127
MAX_GROUP_LENGTH = 255
MAX_BROKER_NAME_LENGTH = 127

TOPIC_PATTERN = rf"^{NAME_CHARS}{{1,{MAX_TOPIC_LENGTH}}}$"
GROUP_PATTERN = rf"^{NAME_CHARS}{{1,{MAX_GROUP_LENGTH}}}$"
BROKER_NAME_PATTERN = rf"^{NAME_CHARS}{{1,{MAX_BROKER_NAME_LENGTH}}}$"

TOPIC_NAME_RE = re.compile(TOPIC_PATTERN)
BROKER_NAME_RE = re.compile(BROKER_NAME_PATTERN)
