"""The client against a real creditd: CREDITD_URL and CREDITD_ADMIN_TOKEN name
it (client/python_test.go starts one and runs these with them). Without them
these tests are skipped."""

import http.server
import json
import os
import threading
import time
import unittest
import urllib.request

import creditd

BASE = os.environ.get("CREDITD_URL", "")
ADMIN_TOKEN = os.environ.get("CREDITD_ADMIN_TOKEN", "")
SKIP = "CREDITD_URL and CREDITD_ADMIN_TOKEN are not set (client/python_test.go sets them)"


def admin(method, path, body=None):
    """A call of the operator API, which the client does not cover."""
    req = urllib.request.Request(
        BASE + path,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(req, timeout=30) as res:
        return json.loads(res.read())


class Deliveries(http.server.ThreadingHTTPServer):
    """A webhook receiver that keeps what it is sent, raw."""

    def __init__(self):
        self.received = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.received.append((self.headers, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), Handler)


@unittest.skipUnless(BASE and ADMIN_TOKEN, SKIP)
class LiveTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        tenant = admin("POST", "/admin/v1/tenants", {"name": f"py-client-{time.time_ns()}"})
        cls.receiver = Deliveries()
        threading.Thread(target=cls.receiver.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        hook = admin("PUT", f"/admin/v1/tenants/{tenant['tenant']['id']}/webhook",
                     {"url": f"http://127.0.0.1:{cls.receiver.server_address[1]}/hooks"})
        cls.secret = hook["secret"]
        cls.c = creditd.Client(BASE, tenant["api_keys"]["live"])

    @classmethod
    def tearDownClass(cls):
        cls.receiver.shutdown()
        cls.receiver.server_close()

    def test_1_customer_grant_consume_replay_check(self):
        c = self.c
        ada = c.create_customer({"external_id": "ada", "display_name": "Ada"})
        self.assertEqual((ada["external_id"], ada["environment"]), ("ada", "live"))
        self.assertEqual(c.get_customer_by_external_id("ada")["id"], ada["id"])

        first, again = creditd.Response(), creditd.Response()
        g = c.grant_credits("ada", {"credits": 10_000, "source": "promotional", "reason": "welcome"}, response=first)
        self.assertEqual(g["account"]["balance"], 10_000)
        self.assertFalse(first.replayed)
        g2 = c.grant_credits("ada", {"credits": 10_000, "source": "promotional", "reason": "welcome"},
                             idempotency_key=first.idempotency_key, response=again)
        self.assertTrue(again.replayed)
        self.assertEqual(g2["transaction"]["id"], g["transaction"]["id"])

        c.create_metering_rule({"billable_metric_key": "api_calls", "cost_type": "per_unit", "unit_cost": 100})
        chk = c.check_entitlement(customer_id="ada", billable_metric_key="api_calls", units=3)
        self.assertTrue(chk["allowed"])
        self.assertEqual((chk["type"], chk["estimated_cost"]), ("metered", 300))

        body = {"customer_id": "ada", "billable_metric_key": "api_calls", "units": 2}
        one, two = creditd.Response(), creditd.Response()
        con = c.consume(body, idempotency_key="py-u-1", response=one)
        self.assertEqual((con["charged"], con["balance_after"]), (200, 9_800))
        self.assertEqual((one.status, one.replayed, one.idempotency_key, one.attempts), (200, False, "py-u-1", 1))
        replay = c.consume(body, idempotency_key="py-u-1", response=two)
        self.assertEqual(replay, con, "a replay answers the first answer")
        self.assertTrue(two.replayed)
        self.assertEqual(two.headers.get("x-idempotent-replayed"), "true")
        self.assertEqual(c.get_credits("ada")["balance"], 9_800, "the replay charged nothing")

    def test_2_problems(self):
        c = self.c
        c.create_customer({"external_id": "bob"})
        c.grant_credits("bob", {"credits": 100, "source": "promotional", "reason": "welcome"})
        with self.assertRaises(creditd.Problem) as cm:
            c.adjust_credits("bob", {"delta": -1_000_000, "source": "manual", "reason": "too much"})
        p = cm.exception
        self.assertTrue(creditd.is_problem(p, creditd.PROBLEM_INSUFFICIENT_CREDITS), repr(p))
        self.assertEqual(p.status, 409)
        self.assertTrue(p.title and p.detail and p.request_id, vars(p))

        with self.assertRaises(creditd.Problem) as cm:
            c.create_customer({})  # type: ignore[typeddict-item]
        p = cm.exception
        self.assertEqual((p.type, p.status, p.field), (creditd.PROBLEM_VALIDATION, 422, "external_id"))
        self.assertEqual([e.field for e in p.errors], ["external_id"])

        info = creditd.Response()
        with self.assertRaises(creditd.Problem) as cm:
            c.get_customer("nobody", response=info)
        self.assertEqual((cm.exception.type, cm.exception.status, info.attempts), ("not-found", 404, 1))
        self.assertEqual(cm.exception.request_id, info.request_id)

    def test_3_webhook_from_creditd_verifies(self):
        ping = self.c.test_webhook()
        self.assertEqual(ping["event_type"], "test.ping")
        v = creditd.WebhookVerifier(self.secret)
        deadline = time.monotonic() + 20
        got = None
        while got is None and time.monotonic() < deadline:
            got = next((d for d in list(self.receiver.received) if d[0].get("webhook-id") == ping["event_id"]), None)
            time.sleep(0.05)
        self.assertIsNotNone(got, "the test.ping was delivered")
        headers, body = got
        event = v.parse(headers, body)
        self.assertEqual((event["event_id"], event["event_type"]), (ping["event_id"], "test.ping"))
        with self.assertRaises(creditd.WebhookSignatureError):
            v.verify(headers, body + b" ")
        for h, b in list(self.receiver.received):
            v.verify(h, b)  # every delivery verifies


if __name__ == "__main__":
    unittest.main()
