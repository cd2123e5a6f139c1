"""The retry policy, idempotency keys and problem parsing against a local
http.server that answers from a script: the rules of client/client.go and
client/problem.go, which the Python client shares."""

import datetime
import email.utils
import http.client
import http.server
import json
import threading
import time
import unittest

import creditd
from creditd.problem import parse_problem, parse_retry_after


class ScriptedServer:
    """Answers each request with the next scripted (status, headers, body);
    the status "drop" closes the connection without an answer."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append({"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                status, headers, out = outer.script.pop(0)
                if status == "drop":
                    self.close_connection = True
                    return
                if status == "slow":
                    # ("slow", {"delay": seconds}, body): a 200 that late.
                    time.sleep(headers["delay"])
                    status, headers = 200, {"Content-Type": "application/json"}
                if isinstance(out, (dict, list)):
                    out = json.dumps(out)
                out = out.encode() if isinstance(out, str) else out
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = answer

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def problem(status, type_, detail="", **more):
    return (status, {"Content-Type": "application/problem+json"},
            {"type": type_, "title": type_, "status": status, "detail": detail, "request_id": "req-1", **more})


OK = (200, {"Content-Type": "application/json"}, {"ok": True})
GRANT = {"credits": 100, "source": "promotional", "reason": "welcome"}


class RetryTest(unittest.TestCase):
    def client(self, srv, **kw):
        waits = []
        kw.setdefault("sleep", waits.append)
        return creditd.Client(srv.url + "/", "ck_test_1", **kw), waits

    def test_503_then_success_reuses_the_key(self):
        with ScriptedServer([problem(503, "unavailable"), problem(503, "unavailable"), OK]) as srv:
            c, waits = self.client(srv)
            info = creditd.Response()
            self.assertEqual(c.grant_credits("alice", GRANT, response=info), {"ok": True})
        keys = {r["headers"]["idempotency-key"] for r in srv.requests}
        self.assertEqual(len(srv.requests), 3)
        self.assertEqual(len(keys), 1, "one key across the call's retries")
        self.assertEqual(info.idempotency_key, keys.pop())
        self.assertEqual(info.attempts, 3)
        self.assertEqual(info.status, 200)
        # back-off from 200 ms, doubled, jittered to 50-100 %
        self.assertTrue(0.1 <= waits[0] <= 0.2 and 0.2 <= waits[1] <= 0.4, waits)
        r = srv.requests[0]
        self.assertEqual((r["method"], r["path"]), ("POST", "/v1/customers/alice/credits/grant"))
        self.assertEqual(r["headers"]["x-api-key"], "ck_test_1")
        self.assertEqual(json.loads(r["body"]), GRANT)

    def test_each_call_gets_its_own_key_unless_given(self):
        with ScriptedServer([OK, OK, (201, {"X-Idempotent-Replayed": "true"}, {"ok": True})]) as srv:
            c, _ = self.client(srv)
            c.grant_credits("alice", GRANT)
            c.grant_credits("alice", GRANT)
            info = creditd.Response()
            c.grant_credits("alice", GRANT, idempotency_key="g-1", response=info)
        keys = [r["headers"]["idempotency-key"] for r in srv.requests]
        self.assertNotEqual(keys[0], keys[1])
        self.assertEqual(keys[2], "g-1")
        self.assertTrue(info.replayed)

    def test_gets_send_no_key(self):
        with ScriptedServer([OK]) as srv:
            c, _ = self.client(srv)
            info = creditd.Response()
            c.get_customer("alice", response=info)
        self.assertNotIn("idempotency-key", srv.requests[0]["headers"])
        self.assertEqual(info.idempotency_key, "")

    def test_retry_after_is_honoured(self):
        with ScriptedServer([(429, {"Retry-After": "2"}, {"type": "rate-limited", "status": 429}), OK]) as srv:
            c, waits = self.client(srv)
            c.get_customer("alice")
        self.assertEqual(waits, [2.0])

    def test_retry_after_past_the_max_delay_ends_the_call(self):
        with ScriptedServer([(429, {"Retry-After": "60"}, {"type": "rate-limited", "status": 429})]) as srv:
            c, waits = self.client(srv)
            with self.assertRaises(creditd.Problem) as cm:
                c.get_customer("alice")
        self.assertEqual((cm.exception.status, cm.exception.retry_after, waits), (429, 60.0, []))

    def test_attempts_are_bounded(self):
        with ScriptedServer([problem(503, "unavailable")] * 2) as srv:
            c, waits = self.client(srv, max_attempts=2)
            info = creditd.Response()
            with self.assertRaises(creditd.Problem):
                c.get_customer("alice", response=info)
        self.assertEqual((len(srv.requests), info.attempts, len(waits)), (2, 2, 1))

    def test_in_progress_409_is_retried_other_409s_are_not(self):
        busy = problem(409, "conflict", "a request with this Idempotency-Key is still in progress")
        with ScriptedServer([busy, OK, problem(409, "insufficient-credits", "balance 0")]) as srv:
            c, waits = self.client(srv)
            self.assertEqual(c.consume({"customer_id": "a", "billable_metric_key": "m", "units": 1}), {"ok": True})
            with self.assertRaises(creditd.Problem) as cm:
                c.consume({"customer_id": "a", "billable_metric_key": "m", "units": 1})
        self.assertEqual(len(waits), 1)
        self.assertEqual(srv.requests[0]["headers"]["idempotency-key"], srv.requests[1]["headers"]["idempotency-key"])
        self.assertTrue(creditd.is_problem(cm.exception, creditd.PROBLEM_INSUFFICIENT_CREDITS))

    def test_transport_error_retried_only_when_repeatable(self):
        with ScriptedServer([("drop", {}, b""), OK, ("drop", {}, b""), ("drop", {}, b""), OK]) as srv:
            c, waits = self.client(srv)
            self.assertEqual(c.get_customer("alice"), {"ok": True})
            # a request with no key may have applied: it is not sent again
            with self.assertRaises((http.client.HTTPException, ConnectionError, OSError)):
                c._request("POST", "/v1/x", idempotent=False, body={})
            self.assertEqual(c.grant_credits("alice", GRANT), {"ok": True})
        self.assertEqual(len(srv.requests), 5)
        self.assertEqual(len(waits), 2)

    def test_deadline_bounds_the_whole_call(self):
        # A slow answer: the attempt's socket timeout is what is left of the
        # deadline, and the call ends with TimeoutError, not after 30 s.
        with ScriptedServer([("slow", {"delay": 1.5}, {"ok": True})] * 3) as srv:
            c, waits = self.client(srv)
            fast = c.with_options(deadline=0.3)
            started = time.monotonic()
            with self.assertRaises(TimeoutError):
                fast.get_customer("alice")
            took = time.monotonic() - started
        self.assertLess(took, 1.2, "the deadline did not bound the call")
        self.assertIsNone(c.deadline, "with_options changed the client it copied")
        self.assertEqual(c.timeout, creditd.client.DEFAULT_TIMEOUT)

    def test_deadline_ends_a_wait_it_cannot_cover(self):
        # Retry-After 2 s under a 1 s deadline: the problem at once, no sleep.
        with ScriptedServer([(503, {"Retry-After": "2"}, {"type": "unavailable", "status": 503}), OK]) as srv:
            c, waits = self.client(srv)
            with self.assertRaises(creditd.Problem) as cm:
                c.with_options(deadline=1).get_customer("alice")
        self.assertEqual((cm.exception.status, waits, len(srv.requests)), (503, [], 1))
        # Within the deadline the same retry runs.
        with ScriptedServer([(503, {"Retry-After": "1"}, {"type": "unavailable", "status": 503}), OK]) as srv:
            c, waits = self.client(srv)
            self.assertEqual(c.with_options(deadline=5, max_attempts=2).get_customer("alice"), {"ok": True})
        self.assertEqual(waits, [1.0])
        with self.assertRaises(ValueError):
            c.with_options(deadline=0)

    def test_parameters(self):
        with ScriptedServer([OK, OK, (204, {}, b"")]) as srv:
            c, _ = self.client(srv)
            at = datetime.datetime(2026, 11, 1, tzinfo=datetime.timezone.utc)
            c.tenant_usage(granularity="day", from_=at, to="2026-12-01T00:00:00Z", billable_metric_key="api call")
            c.get_credits("a/b?c", include_blocks="true")
            self.assertIsNone(c.delete_customer("alice"))
        self.assertEqual(srv.requests[0]["path"],
                         "/v1/usage?from=2026-11-01T00%3A00%3A00Z&to=2026-12-01T00%3A00%3A00Z&granularity=day&billable_metric_key=api+call")
        self.assertEqual(srv.requests[1]["path"], "/v1/customers/a%2Fb%3Fc/credits?include_blocks=true")

    def test_pages(self):
        page1 = {"data": [{"id": "1"}], "pagination": {"has_more": True, "next_cursor": "c1"}}
        page2 = {"data": [{"id": "2"}], "pagination": {"has_more": False, "next_cursor": None}}
        with ScriptedServer([(200, {}, page1), (200, {}, page2)]) as srv:
            c, _ = self.client(srv)
            self.assertEqual([x["id"] for x in c.list_customers_all(limit=1)], ["1", "2"])
        self.assertEqual(srv.requests[1]["path"], "/v1/customers?cursor=c1&limit=1")


class ProblemTest(unittest.TestCase):
    def test_validation_problem(self):
        body = json.dumps({
            "type": "validation-error", "title": "Validation error", "status": 422,
            "detail": "external_id is required", "field": "external_id",
            "errors": [{"field": "external_id", "message": "is required"}], "request_id": "r-9",
        }).encode()
        p = parse_problem(422, {"x-request-id": "r-header"}, body)
        self.assertEqual((p.type, p.title, p.status, p.detail, p.field, p.request_id),
                         ("validation-error", "Validation error", 422, "external_id is required", "external_id", "r-9"))
        self.assertEqual(p.errors, [creditd.FieldError(field="external_id", message="is required")])
        self.assertEqual(str(p), "creditd: 422 validation-error (external_id): external_id is required")
        self.assertFalse(p.in_progress)

    def test_status_line_and_header_win(self):
        p = parse_problem(409, {"x-request-id": "r-h"}, b'{"type": "conflict", "status": 200, "current": 3, "cap": 5, "shortfall": 8}')
        self.assertEqual((p.status, p.request_id, p.current, p.cap, p.shortfall), (409, "r-h", 3, 5, 8))

    def test_not_a_problem(self):
        p = parse_problem(502, {}, b"<html>" + b"x" * 500 + b"</html>")
        self.assertEqual((p.type, p.title, p.status, len(p.detail)), ("", "Bad Gateway", 502, 200))
        self.assertEqual(str(p)[:25], "creditd: 502 Bad Gateway:")
        self.assertEqual(parse_problem(500, {}, b'{"status": 500}').title, "Internal Server Error")

    def test_retry_after(self):
        now = 1_700_000_000.0
        self.assertEqual(parse_retry_after("7", now), 7.0)
        self.assertEqual(parse_retry_after("-3", now), 0.0)
        self.assertEqual(parse_retry_after("", now), 0.0)
        self.assertEqual(parse_retry_after("soon", now), 0.0)
        self.assertEqual(parse_retry_after("+-5", now), 0.0)
        self.assertEqual(parse_retry_after(" 3 ", now), 3.0)
        self.assertEqual(parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now), 30.0)
        self.assertEqual(parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now), 0.0)


if __name__ == "__main__":
    unittest.main()
