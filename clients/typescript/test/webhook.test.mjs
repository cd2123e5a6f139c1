// The webhook verifier against the Standard Webhooks specification's
// published example (also the vector creditd's signer is tested with).
import { test } from "node:test";
import assert from "node:assert/strict";
import { signWebhook, verifyWebhook, parseWebhook, WebhookVerificationError } from "../dist/index.js";

const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const ts = 1614265330;
const body = '{"test": 2432232314}';
const sig = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
const headers = (signature, timestamp = String(ts)) => ({
  "webhook-id": id,
  "webhook-timestamp": timestamp,
  "webhook-signature": signature,
});

test("signWebhook gives the specification's signature", () => {
  assert.equal(signWebhook(secret, id, ts, body), sig);
  assert.equal(signWebhook(secret, id, ts, Buffer.from(body)), sig);
});

test("verifyWebhook accepts the vector and refuses each tampering", () => {
  const other = signWebhook("whsec_c2VjcmV0LW9mLWFub3RoZXItdGVuYW50", id, ts, body);
  const now = ts + 60;
  const cases = [
    { name: "valid", h: headers(sig), body, now, want: null },
    { name: "one of several signatures", h: headers(`${other} ${sig}`), body, now, want: null },
    { name: "fetch Headers", h: new Headers(headers(sig)), body, now, want: null },
    { name: "tampered body", h: headers(sig), body: '{"test": 2432232315}', now, want: "signature" },
    { name: "other secret", h: headers(other), body, now, want: "signature" },
    { name: "moved timestamp", h: headers(sig, String(ts + 1)), body, now, want: "signature" },
    { name: "unknown version", h: headers(`v2,${sig.slice(3)}`), body, now, want: "signature" },
    { name: "too old", h: headers(sig), body, now: ts + 360, want: "timestamp" },
    { name: "from the future", h: headers(sig), body, now: ts - 360, want: "timestamp" },
    { name: "no signature", h: headers(""), body, now, want: "headers" },
    { name: "bad timestamp", h: headers(sig, "soon"), body, now, want: "headers" },
  ];
  for (const c of cases) {
    const run = () => verifyWebhook(secret, c.h, c.body, { nowSeconds: c.now });
    if (c.want === null) {
      assert.doesNotThrow(run, c.name);
    } else {
      assert.throws(run, (err) => err instanceof WebhookVerificationError && err.reason === c.want, c.name);
    }
  }
  assert.deepEqual(parseWebhook(secret, headers(sig), body, { nowSeconds: now }), { test: 2432232314 });
  assert.throws(() => verifyWebhook("whsec_not base64!", headers(sig), body), TypeError);
});
