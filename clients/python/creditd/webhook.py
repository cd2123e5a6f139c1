"""Verification of creditd's webhook signatures (Standard Webhooks), as
client/webhook.go does it: webhook-signature holds "v1,<base64 HMAC-SHA256>"
of "{webhook-id}.{webhook-timestamp}.{body}", keyed by the base64-decoded part
of the tenant's whsec_ secret (engine/webhooks.go's Sign)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import time
from typing import Any, Optional, Union

from .types_gen import WebhookEnvelope

# How far a delivery's webhook-timestamp may be from the receiver's clock,
# either way, in seconds (the Standard Webhooks default): an older signed
# request replayed by someone who captured it is refused.
DEFAULT_WEBHOOK_TOLERANCE = 300.0

# strconv.ParseInt's grammar, so that Go and Python accept the same headers.
_TIMESTAMP = re.compile(r"[+-]?[0-9]+")


class WebhookVerificationError(Exception):
    """A delivery that did not verify; reason is "headers", "timestamp" or
    "signature" (one subclass each)."""

    reason = ""


class WebhookHeadersError(WebhookVerificationError):
    """webhook-id, webhook-timestamp or webhook-signature is missing or malformed."""

    reason = "headers"


class WebhookTimestampError(WebhookVerificationError):
    """The timestamp is outside the tolerance."""

    reason = "timestamp"


class WebhookSignatureError(WebhookVerificationError):
    """No signature matches the secret."""

    reason = "signature"


Headers = Any  # a Mapping, http.server's email.message.Message, or any object with items()
Body = Union[bytes, bytearray, str]


def _key(secret: str) -> bytes:
    b64 = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ValueError(f"creditd: the webhook secret is not whsec_ and base64: {e}") from e
    if not key:
        raise ValueError("creditd: the webhook secret is empty")
    return key


def _header(headers: Headers, name: str) -> str:
    """The first value of a header, its name matched in any case."""
    for k, v in headers.items():
        if k.lower() == name:
            if isinstance(v, (list, tuple)):
                v = v[0] if v else ""
            return v if isinstance(v, str) else ""
    return ""


def _bytes(body: Body) -> bytes:
    return body.encode("utf-8") if isinstance(body, str) else bytes(body)


def _sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> bytes:
    return hmac.new(key, f"{msg_id}.{timestamp}.".encode("utf-8") + body, hashlib.sha256).digest()


def sign_webhook(secret: str, msg_id: str, timestamp: int, body: Body) -> str:
    """The webhook-signature value creditd sends for a delivery of body with id
    at timestamp (unix seconds), for testing a receiver."""
    return "v1," + base64.b64encode(_sign(_key(secret), msg_id, int(timestamp), _bytes(body))).decode("ascii")


class WebhookVerifier:
    """Checks the signatures creditd puts on its webhook deliveries. It keeps
    no state past the key: safe to share across threads."""

    def __init__(self, secret: str, tolerance: float = DEFAULT_WEBHOOK_TOLERANCE):
        """secret is the tenant's whsec_ signing secret (the prefix is
        optional); a ValueError when it is not base64. tolerance bounds the
        timestamp's distance from now, in seconds."""
        self._key = _key(secret)
        self.tolerance = tolerance if tolerance > 0 else DEFAULT_WEBHOOK_TOLERANCE

    def verify(self, headers: Headers, body: Body, now: Optional[float] = None) -> None:
        """Checks a delivery's headers and raw body (exactly as received,
        before any JSON decoding) at now (unix seconds, default the clock).
        Several space-separated signatures (a secret rotation) pass when one
        matches. Raises a WebhookVerificationError subclass."""
        msg_id = _header(headers, "webhook-id")
        ts = _header(headers, "webhook-timestamp")
        sigs = _header(headers, "webhook-signature")
        if not msg_id or not ts or not sigs or not _TIMESTAMP.fullmatch(ts):
            raise WebhookHeadersError("creditd: webhook headers missing or malformed")
        sec = int(ts)
        now = time.time() if now is None else now
        if abs(now - sec) > self.tolerance:
            raise WebhookTimestampError("creditd: webhook timestamp outside the tolerance")
        want = _sign(self._key, msg_id, sec, _bytes(body))
        for s in sigs.split():
            version, _, sig = s.partition(",")
            if version != "v1" or not sig:
                continue
            try:
                got = base64.b64decode(sig, validate=True)
            except (binascii.Error, ValueError):
                continue
            if hmac.compare_digest(got, want):
                return
        raise WebhookSignatureError("creditd: webhook signature does not match")

    def parse(self, headers: Headers, body: Body, now: Optional[float] = None) -> WebhookEnvelope:
        """Verifies a delivery and decodes its body. Dedupe on event_id (also
        the webhook-id header): delivery is at least once."""
        self.verify(headers, body, now)
        return json.loads(_bytes(body))
