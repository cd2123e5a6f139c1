"""What the generated operations and the client share: the call's Response
record and path escaping. Its own module so that operations_gen.py need not
import client.py, which imports it."""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Optional


@dataclasses.dataclass
class Response:
    """What a call saw of its last HTTP answer: pass one as response= and the
    call fills it, also when it raises (the Go client's WithResponse)."""

    # The last answer's status; 0 when none arrived.
    status: int = 0
    # The last answer's headers (RateLimit-*, X-Request-Id), lower-cased names.
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    # True when creditd answered from its idempotency record
    # (X-Idempotent-Replayed): the operation had already applied.
    replayed: bool = False
    # How many times the call was sent.
    attempts: int = 0
    # The key the call sent ("" when it sends none): give it back as
    # idempotency_key to retry the same operation later.
    idempotency_key: str = ""
    # The last answer's X-Request-Id, quoted when reporting.
    request_id: Optional[str] = None


def _segment(value: str) -> str:
    """One path parameter, escaped as a single segment (Go's url.PathEscape):
    an id holding "/" or "?" must not change the route."""
    return urllib.parse.quote(str(value), safe="")
