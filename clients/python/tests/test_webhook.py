"""Webhook verification against the vector client/webhook_test.go checks the
Go client and creditd's signer (engine/webhooks.go) with: the Standard
Webhooks specification's published example."""

import unittest

import creditd

VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = '{"test": 2432232314}'
VECTOR_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def headers(sig: str, ts: str = str(VECTOR_TS)) -> dict:
    return {"webhook-id": VECTOR_ID, "webhook-timestamp": ts, "webhook-signature": sig}


class WebhookTest(unittest.TestCase):
    def test_sign_matches_the_vector(self):
        self.assertEqual(creditd.sign_webhook(VECTOR_SECRET, VECTOR_ID, VECTOR_TS, VECTOR_BODY), VECTOR_SIG)
        self.assertEqual(creditd.sign_webhook(VECTOR_SECRET[len("whsec_"):], VECTOR_ID, VECTOR_TS, VECTOR_BODY.encode()), VECTOR_SIG)

    def test_verify(self):
        v = creditd.WebhookVerifier(VECTOR_SECRET)
        at = VECTOR_TS + 60
        other = creditd.sign_webhook("whsec_c2VjcmV0LW9mLWFub3RoZXItdGVuYW50", VECTOR_ID, VECTOR_TS, VECTOR_BODY)
        cases = [
            ("valid", headers(VECTOR_SIG), VECTOR_BODY, at, None),
            ("bytes body", headers(VECTOR_SIG), VECTOR_BODY.encode(), at, None),
            ("one of several signatures", headers(other + " " + VECTOR_SIG), VECTOR_BODY, at, None),
            ("tampered body", headers(VECTOR_SIG), '{"test": 2432232315}', at, creditd.WebhookSignatureError),
            ("other secret", headers(other), VECTOR_BODY, at, creditd.WebhookSignatureError),
            ("moved timestamp", headers(VECTOR_SIG, "1614265331"), VECTOR_BODY, at, creditd.WebhookSignatureError),
            ("unknown version", headers("v2," + VECTOR_SIG[3:]), VECTOR_BODY, at, creditd.WebhookSignatureError),
            ("signature not base64", headers("v1,not*base64"), VECTOR_BODY, at, creditd.WebhookSignatureError),
            ("too old", headers(VECTOR_SIG), VECTOR_BODY, VECTOR_TS + 6 * 60, creditd.WebhookTimestampError),
            ("from the future", headers(VECTOR_SIG), VECTOR_BODY, VECTOR_TS - 6 * 60, creditd.WebhookTimestampError),
            ("at the tolerance", headers(VECTOR_SIG), VECTOR_BODY, VECTOR_TS + 300, None),
            ("no signature", headers(""), VECTOR_BODY, at, creditd.WebhookHeadersError),
            ("bad timestamp", headers(VECTOR_SIG, "soon"), VECTOR_BODY, at, creditd.WebhookHeadersError),
            ("no id", {"webhook-timestamp": str(VECTOR_TS), "webhook-signature": VECTOR_SIG}, VECTOR_BODY, at, creditd.WebhookHeadersError),
        ]
        for name, h, body, now, want in cases:
            with self.subTest(name):
                if want is None:
                    v.verify(h, body, now=now)
                else:
                    with self.assertRaises(want) as cm:
                        v.verify(h, body, now=now)
                    self.assertIsInstance(cm.exception, creditd.WebhookVerificationError)
                    self.assertEqual(cm.exception.reason, want.reason)

    def test_headers_in_any_case_and_shape(self):
        v = creditd.WebhookVerifier(VECTOR_SECRET)
        # node-style lists and the capitalised names a framework may keep
        h = {"Webhook-Id": [VECTOR_ID], "WEBHOOK-TIMESTAMP": str(VECTOR_TS), "webhook-signature": VECTOR_SIG}
        v.verify(h, VECTOR_BODY, now=VECTOR_TS)
        import email.message

        m = email.message.Message()  # what http.server hands a handler
        for k, val in headers(VECTOR_SIG).items():
            m[k] = val
        v.verify(m, VECTOR_BODY, now=VECTOR_TS)

    def test_parse(self):
        body = '{"event_id": "e1", "event_type": "test.ping", "data": {}}'
        ts = 1_700_000_000
        sig = creditd.sign_webhook(VECTOR_SECRET, "e1", ts, body)
        h = {"webhook-id": "e1", "webhook-timestamp": str(ts), "webhook-signature": sig}
        event = creditd.WebhookVerifier(VECTOR_SECRET).parse(h, body, now=ts)
        self.assertEqual(event["event_type"], "test.ping")

    def test_bad_secret(self):
        for secret in ("whsec_not base64!", "whsec_", ""):
            with self.subTest(secret), self.assertRaises(ValueError):
                creditd.WebhookVerifier(secret)


if __name__ == "__main__":
    unittest.main()
