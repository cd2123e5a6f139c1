"""RFC 9457 problem errors, as client/problem.go reads them."""

from __future__ import annotations

import dataclasses
import email.utils
import http
import json
import re
import time
from typing import Any, Mapping, Optional

# Problem types creditd answers (the Problem schema's type enum).
PROBLEM_BAD_REQUEST = "bad-request"
PROBLEM_UNAUTHORIZED = "unauthorized"
PROBLEM_NOT_FOUND = "not-found"
PROBLEM_CONFLICT = "conflict"
PROBLEM_INSUFFICIENT_CREDITS = "insufficient-credits"
PROBLEM_RESERVATION_EXPIRED = "reservation-expired"
PROBLEM_VALIDATION = "validation-error"
PROBLEM_RATE_LIMITED = "rate-limited"
PROBLEM_INTERNAL = "internal"
# The type of a 503 (a replica or store not ready); the call was retried
# before it was raised.
PROBLEM_UNAVAILABLE = "unavailable"

# A problem body larger than this is not read further (client/client.go's
# maxProblemBytes).
MAX_PROBLEM_BYTES = 1 << 20
# The most of a non-problem body kept as the detail.
_MAX_RAW_DETAIL = 200
# Retry-After seconds are capped so that the arithmetic stays in range (Go's 1<<30).
_MAX_RETRY_AFTER_SECONDS = 1 << 30
# strconv.ParseInt's grammar, which client/problem.go reads delay-seconds with.
_DELAY_SECONDS = re.compile(r"[+-]?[0-9]+")


@dataclasses.dataclass(frozen=True)
class FieldError:
    """One entry of a problem's errors list."""

    # The input member, query parameter or header at fault.
    field: str
    # What is wrong with it.
    message: str


class Problem(Exception):
    """An error creditd answered: its RFC 9457 body (the Problem and
    GaugeCapProblem schemas) and the status. A body that is not a problem (a
    proxy's page, say) gives a Problem with an empty type, the status and the
    start of the body as detail."""

    def __init__(
        self,
        status: int,
        type: str = "",
        title: str = "",
        detail: str = "",
        field: Optional[str] = None,
        errors: Optional[list[FieldError]] = None,
        request_id: str = "",
        current: Optional[int] = None,
        cap: Optional[int] = None,
        shortfall: Optional[int] = None,
        retry_after: float = 0.0,
    ):
        # One of the PROBLEM_* constants; "" when the body was no problem.
        self.type = type
        # The short summary of type.
        self.title = title
        # The HTTP status (the status line wins over the body).
        self.status = status
        # What went wrong with this request.
        self.detail = detail
        # The input member, query parameter or header at fault.
        self.field = field
        # field and detail as a list: one shape for one or many fields.
        self.errors = errors or []
        # Also the X-Request-Id header: quote it when reporting.
        self.request_id = request_id
        # The gauge count, cap and shortfall of a 409 increment past the cap.
        self.current = current
        self.cap = cap
        self.shortfall = shortfall
        # The answer's Retry-After in seconds (0 when none).
        self.retry_after = retry_after
        super().__init__(str(self))

    def __str__(self) -> str:
        s = f"creditd: {self.status}"
        if self.type:
            s += " " + self.type
        elif self.title:
            s += " " + self.title
        if self.field:
            s += f" ({self.field})"
        if self.detail:
            s += ": " + self.detail
        return s

    def __repr__(self) -> str:
        return f"Problem({str(self)!r}, request_id={self.request_id!r})"

    @property
    def in_progress(self) -> bool:
        """The 409 of a request whose Idempotency-Key a twin request still
        holds: the same call may be sent again with the same key. creditd
        says so only in the detail."""
        return self.status == 409 and self.type == PROBLEM_CONFLICT and "still in progress" in self.detail


def is_problem(err: BaseException, type: Optional[str] = None) -> bool:
    """Reports whether err is a Problem, of type `type` (a PROBLEM_* constant) when given."""
    return isinstance(err, Problem) and (type is None or err.type == type)


def _str(body: Mapping[str, Any], name: str) -> str:
    v = body.get(name)
    return v if isinstance(v, str) else ""


def _int(body: Mapping[str, Any], name: str) -> Optional[int]:
    v = body.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_problem(status: int, headers: Mapping[str, str], raw: bytes, now: Optional[float] = None) -> Problem:
    """The Problem of a non-2xx answer: its status, headers (lower-case names)
    and body."""
    raw = raw[:MAX_PROBLEM_BYTES]
    body: Any = None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        pass
    request_id = headers.get("x-request-id", "")
    retry_after = parse_retry_after(headers.get("retry-after", ""), now)
    if not isinstance(body, dict) or not _str(body, "type"):
        detail = raw.decode("utf-8", "replace").strip()[:_MAX_RAW_DETAIL]
        try:
            title = http.HTTPStatus(status).phrase
        except ValueError:
            title = ""
        return Problem(status, title=title, detail=detail, request_id=request_id, retry_after=retry_after)
    errors = [
        FieldError(field=_str(e, "field"), message=_str(e, "message"))
        for e in body.get("errors") or []
        if isinstance(e, dict)
    ]
    return Problem(
        status,
        type=_str(body, "type"),
        title=_str(body, "title"),
        detail=_str(body, "detail"),
        field=_str(body, "field") or None,
        errors=errors,
        request_id=_str(body, "request_id") or request_id,
        current=_int(body, "current"),
        cap=_int(body, "cap"),
        shortfall=_int(body, "shortfall"),
        retry_after=retry_after,
    )


def parse_retry_after(value: str, now: Optional[float] = None) -> float:
    """A Retry-After of delay-seconds or an HTTP-date, in seconds (0 when
    absent, malformed or past)."""
    v = (value or "").strip()
    if not v:
        return 0.0
    if _DELAY_SECONDS.fullmatch(v):
        return float(max(0, min(int(v), _MAX_RETRY_AFTER_SECONDS)))
    try:
        at = email.utils.parsedate_to_datetime(v).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return 0.0
    now = time.time() if now is None else now
    return at - now if at > now else 0.0
