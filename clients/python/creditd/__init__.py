"""creditd's Python client: one method per tenant operation of
api/openapi.json, TypedDicts of its schemas (creditd.types_gen), RFC 9457
problems raised as creditd.Problem and webhook signature verification.
Standard library only."""

from . import types_gen as types
from ._transport import Response
from .client import (
    DEFAULT_BASE_DELAY,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DELAY,
    DEFAULT_TIMEOUT,
    VERSION,
    Client,
)
from .problem import (
    PROBLEM_BAD_REQUEST,
    PROBLEM_CONFLICT,
    PROBLEM_INSUFFICIENT_CREDITS,
    PROBLEM_INTERNAL,
    PROBLEM_NOT_FOUND,
    PROBLEM_RATE_LIMITED,
    PROBLEM_RESERVATION_EXPIRED,
    PROBLEM_UNAUTHORIZED,
    PROBLEM_UNAVAILABLE,
    PROBLEM_VALIDATION,
    FieldError,
    Problem,
    is_problem,
)
from .webhook import (
    DEFAULT_WEBHOOK_TOLERANCE,
    WebhookHeadersError,
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerificationError,
    WebhookVerifier,
    sign_webhook,
)

__all__ = [
    "Client",
    "DEFAULT_BASE_DELAY",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_DELAY",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WEBHOOK_TOLERANCE",
    "FieldError",
    "PROBLEM_BAD_REQUEST",
    "PROBLEM_CONFLICT",
    "PROBLEM_INSUFFICIENT_CREDITS",
    "PROBLEM_INTERNAL",
    "PROBLEM_NOT_FOUND",
    "PROBLEM_RATE_LIMITED",
    "PROBLEM_RESERVATION_EXPIRED",
    "PROBLEM_UNAUTHORIZED",
    "PROBLEM_UNAVAILABLE",
    "PROBLEM_VALIDATION",
    "Problem",
    "Response",
    "VERSION",
    "WebhookHeadersError",
    "WebhookSignatureError",
    "WebhookTimestampError",
    "WebhookVerificationError",
    "WebhookVerifier",
    "is_problem",
    "sign_webhook",
    "types",
]
