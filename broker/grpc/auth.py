"""Who is calling: the request metadata every RocketMQ 5 client sends, and its access-key
signature (RocketMQ 5 ACL) checked against the broker's accounts.

Clients sign each call: `authorization: MQv2-HMAC-SHA1 Credential=<accessKey>,
SignedHeaders=x-mq-date-time, Signature=<hex(HMAC-SHA1(secretKey, x-mq-date-time))>`. An
account's access key is its `name` in the ACL file and its secret key its `token` (the bearer
token of HTTP): one set of accounts and rights for both protocols.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

from broker.errors import BrokerCode, BrokerError
from broker.service.acl import ANONYMOUS, AccessControl, Account

CLIENT_ID = "x-mq-client-id"
DATE_TIME = "x-mq-date-time"
_SIGNATURE = re.compile(
    r"MQv2-HMAC-SHA1\s+Credential=([^,\s]+),\s*SignedHeaders=([^,\s]+),\s*Signature=([0-9A-Fa-f]+)\s*"
)


def metadata(context: Any) -> dict[str, str]:
    """The call's text metadata (binary `-bin` entries left out), keys lower-case."""
    return {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def authenticate(acl: AccessControl, meta: dict[str, str]) -> Account:
    """The account that signed the call; ANONYMOUS when ACL is off. UNAUTHORIZED for a missing
    or malformed signature, an unknown access key or a wrong secret."""
    if not acl.enabled:
        return ANONYMOUS
    header = meta.get("authorization")
    if not header:
        raise BrokerError(BrokerCode.UNAUTHORIZED, "missing authorization (set the client's credentials)")
    m = _SIGNATURE.fullmatch(header)
    if m is None:
        raise BrokerError(
            BrokerCode.UNAUTHORIZED,
            "authorization is not 'MQv2-HMAC-SHA1 Credential=..., SignedHeaders=..., Signature=...'",
        )
    access_key, signed_headers, signature = m.groups()
    if signed_headers.lower() != DATE_TIME:
        raise BrokerError(BrokerCode.UNAUTHORIZED, f"SignedHeaders must be {DATE_TIME}")
    signed = meta.get(DATE_TIME, "").encode()
    wanted = signature.lower().encode()
    for account in acl.accounts:
        if account.name == access_key:
            mac = hmac.new(account.token.encode(), signed, hashlib.sha1).hexdigest().encode()
            if hmac.compare_digest(mac, wanted):
                return account
    raise BrokerError(BrokerCode.UNAUTHORIZED, "unknown access key or bad signature")
