"""The client: creditd's retry and idempotency rules over urllib.request.

Every POST and PATCH (and override DELETE) carries an Idempotency-Key: the
idempotency_key given, else a new UUID, and the same key on each of the
call's own retries, so a retried write applies once. A call is sent at most
max_attempts times: again on 429 and 503 (after the Retry-After the server
sent), on 409 "still in progress" (a twin request with the same key is
running) and on a transport error of a request that is safe to repeat (a GET
or one with an Idempotency-Key). These are client/client.go's rules, which
clients/typescript/src/client.ts shares.
"""

from __future__ import annotations

import copy
import datetime
import http.client
import json
import random
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Mapping, Optional

from ._transport import Response
from .operations_gen import Operations
from .problem import MAX_PROBLEM_BYTES, Problem, parse_problem

VERSION = "0.1.0"

# Defaults of the retry policy, client/client.go's.
# How many times a call is sent at most, the first one included.
DEFAULT_MAX_ATTEMPTS = 4
# The first back-off wait when the server named no Retry-After, in seconds;
# each later wait doubles it (with jitter).
DEFAULT_BASE_DELAY = 0.2
# The longest wait between two attempts, in seconds: a Retry-After longer
# than this ends the call with the problem instead.
DEFAULT_MAX_DELAY = 30.0
# The socket timeout of each attempt, in seconds (urllib's: per blocking
# read or connect, not the whole answer).
DEFAULT_TIMEOUT = 30.0

# The largest success body read (client/client.go's maxBodyBytes).
MAX_BODY_BYTES = 64 << 20

# A transport failure: the request may or may not have reached creditd.
_TRANSPORT_ERRORS = (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError)


class Client(Operations):
    """A client of one creditd with one API key (sent as X-API-Key). It holds
    no connection, so one may be shared across threads."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        base_delay: float = DEFAULT_BASE_DELAY,
        max_delay: float = DEFAULT_MAX_DELAY,
        new_idempotency_key: Optional[Callable[[], str]] = None,
        user_agent: str = "",
        opener: Optional[urllib.request.OpenerDirector] = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """base_url is creditd's ("https://credits.example.com", with or
        without a trailing slash). max_attempts 1 turns retries off; values
        at or below zero keep the defaults, as the other clients do.
        new_idempotency_key makes the keys of calls that give none (each
        unique per operation, at most 256 characters). user_agent prefixes
        the User-Agent (an integration's name and version). opener is the
        urllib opener to send with (proxies, TLS settings)."""
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout if timeout > 0 else DEFAULT_TIMEOUT
        self.max_attempts = max_attempts if max_attempts > 0 else DEFAULT_MAX_ATTEMPTS
        self.base_delay = base_delay if base_delay > 0 else DEFAULT_BASE_DELAY
        self.max_delay = max_delay if max_delay > 0 else DEFAULT_MAX_DELAY
        self._new_key = new_idempotency_key or (lambda: str(uuid.uuid4()))
        self.user_agent = (user_agent + " " if user_agent else "") + "creditd-python/" + VERSION
        self._opener = opener or urllib.request.build_opener()
        self._sleep = sleep
        self.deadline: Optional[float] = None
        self._monotonic: Callable[[], float] = time.monotonic

    def with_options(
        self,
        *,
        deadline: Optional[float] = None,
        timeout: Optional[float] = None,
        max_attempts: Optional[int] = None,
    ) -> "Client":
        """A copy of this client (sharing nothing mutable with it) whose
        calls take these settings; the others stay. deadline bounds each
        whole call, in seconds: every attempt, the waits between them and
        each attempt's socket timeout end by then, and a call still
        unanswered raises TimeoutError, or the last problem when it got
        one (Go: a context deadline; TypeScript: an AbortSignal). A wait the
        deadline cannot cover is not slept: the call ends at once.

            fast = client.with_options(deadline=0.2)
            fast.check_entitlement("alice", "api_calls")
        """
        c = copy.copy(self)
        if deadline is not None:
            if deadline <= 0:
                raise ValueError("deadline must be > 0 seconds")
            c.deadline = deadline
        if timeout is not None and timeout > 0:
            c.timeout = timeout
        if max_attempts is not None and max_attempts > 0:
            c.max_attempts = max_attempts
        return c

    def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        body: Any = None,
        query: Optional[Mapping[str, Any]] = None,
        header: Optional[Mapping[str, Any]] = None,
        idempotency_key: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        response: Optional[Response] = None,
    ) -> Any:
        """Sends one operation, retrying as the module says, and returns its
        decoded 2xx body (None for a 204). Raises Problem for an answered
        error, the urllib or socket error for a transport failure."""
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        key = (idempotency_key or self._new_key()) if idempotent else ""
        target = self.base_url + path
        q = [(k, _format(v)) for k, v in (query or {}).items() if v is not None]
        if q:
            target += "?" + urllib.parse.urlencode(q)
        send_headers = {
            "X-API-Key": self.api_key,
            "Accept": "application/json",
            "User-Agent": self.user_agent,
        }
        if payload is not None:
            send_headers["Content-Type"] = "application/json"
        if key:
            send_headers["Idempotency-Key"] = key
        for k, v in (header or {}).items():
            if v is not None:
                send_headers[k] = _format(v)
        send_headers.update(headers or {})
        # A transport error leaves unknown whether the request applied: only
        # a request that cannot apply twice is sent again.
        repeatable = method == "GET" or key != ""
        info = response if response is not None else Response()
        info.status, info.headers, info.replayed, info.request_id = 0, {}, False, None
        info.idempotency_key = key
        end = None if self.deadline is None else self._monotonic() + self.deadline
        last: Optional[BaseException] = None
        attempt = 0
        while True:
            timeout = self.timeout
            if end is not None:
                left = end - self._monotonic()
                if left <= 0:
                    raise last if isinstance(last, Problem) else TimeoutError(
                        f"creditd: {method} {path}: deadline of {self.deadline} s passed after {attempt} attempts")
                timeout = min(timeout, left)
            attempt += 1
            info.attempts = attempt
            req = urllib.request.Request(target, data=payload, headers=send_headers, method=method)
            try:
                res = self._opener.open(req, timeout=timeout)
            except urllib.error.HTTPError as e:
                _record(info, e.code, e.headers)
                try:
                    raw = e.read(MAX_PROBLEM_BYTES)
                except _TRANSPORT_ERRORS:
                    raw = b""
                finally:
                    e.close()
                p = parse_problem(e.code, info.headers, raw)
                last = p
                retry, wait = self._retryable(p, attempt)
            except _TRANSPORT_ERRORS as e:
                last = e
                retry, wait = repeatable, self._backoff(attempt)
            else:
                # A 2xx is final: a body that does not read or decode is an
                # error, never a retry (the operation applied).
                with res:
                    _record(info, res.status, res.headers)
                    return _decode(res, method, path)
            if not retry or attempt >= self.max_attempts:
                raise last
            if end is not None and self._monotonic() + wait >= end:
                # The wait would outlast the deadline: end now.
                if isinstance(last, Problem):
                    raise last
                raise TimeoutError(f"creditd: {method} {path}: deadline of {self.deadline} s passed after {attempt} attempts") from last
            self._sleep(wait)

    def _retryable(self, p: Problem, attempt: int) -> tuple[bool, float]:
        """Whether an answered problem is worth another attempt and after how long."""
        if p.status in (429, 503):
            if p.retry_after > 0:
                # Honour the server: a wait longer than allowed ends the call.
                return p.retry_after <= self.max_delay, p.retry_after
            return True, self._backoff(attempt)
        if p.in_progress:
            return True, self._backoff(attempt)
        return False, 0.0

    def _backoff(self, attempt: int) -> float:
        """The wait before attempt+1 when the server named none: base_delay
        doubled per attempt, capped at max_delay, jittered to 50-100 %."""
        d = min(self.base_delay * (2 ** min(attempt - 1, 20)), self.max_delay)
        return d / 2 + random.uniform(0, d / 2)


def _decode(res: Any, method: str, path: str) -> Any:
    raw = res.read(MAX_BODY_BYTES + 1)
    if res.status == 204 or not raw:
        return None
    if len(raw) > MAX_BODY_BYTES:
        raise ValueError(f"creditd: the {method} {path} answer is over {MAX_BODY_BYTES} bytes")
    return json.loads(raw)


def _record(info: Response, status: int, headers: Any) -> None:
    info.status = status
    info.headers = {k.lower(): v for k, v in (headers.items() if headers is not None else [])}
    info.replayed = info.headers.get("x-idempotent-replayed") == "true"
    info.request_id = info.headers.get("x-request-id")


def _format(v: Any) -> str:
    """A parameter value as the API reads it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime.datetime):
        if v.tzinfo is None:
            raise ValueError("creditd: a naive datetime parameter is ambiguous; give it a tzinfo")
        return v.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    return str(v)
