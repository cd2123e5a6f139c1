// The fetch wrapper's retry, idempotency and problem rules against a
// scripted local server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createClient, CreditdProblem, isProblem, retryAfterMs } from "../dist/index.js";

const customer = {
  id: "7b0c5a4e-4f5e-4a0e-9a57-1f0b3c1d2e3f",
  tenant_id: "0b0c5a4e-4f5e-4a0e-9a57-1f0b3c1d2e3f",
  environment: "live",
  external_id: "ada",
  display_name: null,
  overage_policy: null,
  low_balance_threshold_mc: null,
  metadata: {},
  created_at: "2026-01-02T03:04:05.678Z",
  updated_at: "2026-01-02T03:04:05.678Z",
};
const problem = (status, type, detail) => JSON.stringify({ type, title: "T", status, detail, request_id: "req-1" });
const busy = problem(409, "conflict", "a request with this Idempotency-Key is still in progress; retry with the same key later");

// script serves each request with the next answer ([status, headers, body])
// and records what it got.
async function script(t, answers) {
  const got = [];
  const srv = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => (body += c));
    req.on("end", () => {
      got.push({ method: req.method, url: req.url, headers: req.headers, body });
      const [status, headers, out] = answers[Math.min(got.length, answers.length) - 1];
      res.writeHead(status, { "Content-Type": "application/json", ...headers });
      res.end(out);
    });
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => srv.close());
  return { url: `http://127.0.0.1:${srv.address().port}/`, got };
}

test("retries: 503 and 429 after Retry-After, 409 in progress after a back-off, one Idempotency-Key", async (t) => {
  const cases = [
    { name: "503 then 201", answers: [[503, { "Retry-After": "1" }, problem(503, "unavailable", "lag")], [201, {}, JSON.stringify(customer)]], attempts: 2, minMs: 1000 },
    { name: "429 then 201", answers: [[429, { "Retry-After": "1" }, problem(429, "rate-limited", "slow")], [201, {}, JSON.stringify(customer)]], attempts: 2, minMs: 1000 },
    { name: "409 in progress twice", answers: [[409, {}, busy], [409, {}, busy], [201, {}, JSON.stringify(customer)]], attempts: 3, minMs: 0 },
    { name: "503 until attempts run out", answers: [[503, { "Retry-After": "0" }, problem(503, "unavailable", "down")]], attempts: 4, minMs: 0, type: "unavailable" },
    { name: "409 conflict is final", answers: [[409, {}, problem(409, "conflict", "taken")], [201, {}, "{}"]], attempts: 1, minMs: 0, type: "conflict" },
    { name: "500 is final", answers: [[500, {}, problem(500, "internal", "oops")], [201, {}, "{}"]], attempts: 1, minMs: 0, type: "internal" },
    { name: "Retry-After past the max delay is final", answers: [[503, { "Retry-After": "120" }, problem(503, "unavailable", "down")], [201, {}, "{}"]], attempts: 1, minMs: 0, type: "unavailable" },
  ];
  await Promise.all(
    cases.map(async (c) => {
      const s = await script(t, c.answers);
      const client = createClient({ baseUrl: s.url, apiKey: "ck_live_x", baseDelayMs: 5 });
      let info;
      const start = Date.now();
      let result, error;
      try {
        result = await client.createCustomer({ body: { external_id: "ada" }, onResponse: (i) => (info = i) });
      } catch (err) {
        error = err;
      }
      const elapsed = Date.now() - start;
      assert.equal(s.got.length, c.attempts, `${c.name}: attempts`);
      assert.equal(info.attempts, c.attempts, `${c.name}: onResponse attempts`);
      assert.ok(elapsed >= c.minMs, `${c.name}: retried after ${elapsed} ms, before the Retry-After`);
      const key = s.got[0].headers["idempotency-key"];
      assert.match(key, /^[0-9a-f-]{36}$/, `${c.name}: generated key`);
      assert.equal(info.idempotencyKey, key);
      for (const r of s.got) {
        assert.equal(r.headers["idempotency-key"], key, `${c.name}: same key on every attempt`);
        assert.equal(r.headers["x-api-key"], "ck_live_x");
        assert.equal(r.method, "POST");
        assert.equal(r.url, "/v1/customers");
        assert.equal(r.body, '{"external_id":"ada"}');
      }
      if (!c.type) {
        assert.equal(error, undefined, `${c.name}: ${error}`);
        assert.equal(result.external_id, "ada");
        return;
      }
      assert.ok(isProblem(error, c.type), `${c.name}: ${error}`);
      assert.equal(error.status, c.answers[0][0]);
      assert.equal(error.requestId, "req-1");
    }),
  );
});

test("an aborted signal ends the wait for a Retry-After", async (t) => {
  const s = await script(t, [[503, { "Retry-After": "10" }, problem(503, "unavailable", "down")]]);
  const client = createClient({ baseUrl: s.url, apiKey: "k" });
  const start = Date.now();
  // Long enough for the first attempt to reach the server on a loaded
  // machine (make test runs packages in parallel), far under Retry-After.
  await assert.rejects(client.getCustomer({ path: { id: "ada" }, signal: AbortSignal.timeout(1500) }), (err) => err.name === "TimeoutError");
  assert.ok(Date.now() - start < 5000, "returned when the signal fired");
  assert.equal(s.got.length, 1);
});

test("call options: a given key, headers, query and path encoding; a GET sends no key", async (t) => {
  const s = await script(t, [[200, { "X-Idempotent-Replayed": "true" }, JSON.stringify({ data: [], pagination: { has_more: false, next_cursor: null } })]]);
  const client = createClient({ baseUrl: s.url, apiKey: "k" });
  const page = await client.listCustomers({ query: { search: "a b", limit: 5, cursor: undefined }, headers: { "X-Trace": "t1" } });
  assert.equal(page.pagination.has_more, false);
  await client.overage({ path: { id: "ada/1" }, query: { from: "2026-01-02T03:04:05Z", to: "2026-01-02T04:04:05Z" } });
  let info;
  await client.updateCustomer({ path: { id: "ada" }, body: { display_name: "" }, idempotencyKey: "my-key", onResponse: (i) => (info = i) });
  assert.equal(s.got[0].url, "/v1/customers?search=a+b&limit=5");
  assert.equal(s.got[0].headers["x-trace"], "t1");
  assert.equal(s.got[0].headers["idempotency-key"], undefined);
  assert.equal(s.got[1].url, "/v1/customers/ada%2F1/overage?from=2026-01-02T03%3A04%3A05Z&to=2026-01-02T04%3A04%3A05Z");
  assert.equal(s.got[2].headers["idempotency-key"], "my-key");
  assert.equal(s.got[2].body, '{"display_name":""}');
  assert.equal(info.replayed, true);
  assert.equal(info.status, 200);
});

test("problems: every member of an RFC 9457 body, the gauge extras, and a body that is not one", async (t) => {
  const gauge = JSON.stringify({ type: "conflict", title: "Conflict", status: 409, detail: "past the cap", request_id: "r2", current: 9, cap: 10, shortfall: 2 });
  const field = JSON.stringify({ type: "validation-error", title: "Validation Error", status: 422, detail: "units must be >= 1", field: "units", errors: [{ field: "units", message: "units must be >= 1" }], request_id: "r3" });
  const s = await script(t, [[409, {}, gauge], [422, {}, field], [502, { "Content-Type": "text/html", "X-Request-Id": "px" }, "<html>bad gateway</html>"]]);
  const client = createClient({ baseUrl: s.url, apiKey: "k" });
  const call = () => client.incrementGauge({ path: { id: "ada", billable_metric_key: "seats" }, body: { amount: 3 } }).then(() => null, (e) => e);
  const p1 = await call();
  assert.ok(p1 instanceof CreditdProblem);
  assert.deepEqual([p1.type, p1.status, p1.detail, p1.requestId, p1.current, p1.cap, p1.shortfall], ["conflict", 409, "past the cap", "r2", 9, 10, 2]);
  const p2 = await call();
  assert.deepEqual([p2.type, p2.field, p2.errors, p2.requestId], ["validation-error", "units", [{ field: "units", message: "units must be >= 1" }], "r3"]);
  assert.match(p2.message, /422 validation-error \(units\): units must be >= 1/);
  const p3 = await call();
  assert.deepEqual([p3.type, p3.status, p3.detail, p3.requestId], ["", 502, "<html>bad gateway</html>", "px"]);
});

test("retryAfterMs reads seconds and HTTP-dates", () => {
  const now = Date.parse("2026-01-01T00:00:00Z");
  assert.equal(retryAfterMs("3", now), 3000);
  assert.equal(retryAfterMs("Thu, 01 Jan 2026 00:00:05 GMT", now), 5000);
  assert.equal(retryAfterMs("garbage", now), 0);
  assert.equal(retryAfterMs(null, now), 0);
});

test("network errors: a GET and a write with a key are sent again, a key-less DELETE is not", async (t) => {
  const seen = {};
  const srv = createServer((req, res) => {
    seen[req.method] = (seen[req.method] ?? 0) + 1;
    if (seen[req.method] === 1) return req.socket.destroy();
    req.resume();
    if (req.method === "DELETE") {
      res.writeHead(204).end();
      return;
    }
    res.writeHead(200, { "Content-Type": "application/json" }).end(JSON.stringify(customer));
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => srv.close());
  const client = createClient({ baseUrl: `http://127.0.0.1:${srv.address().port}`, apiKey: "k", baseDelayMs: 1 });
  assert.equal((await client.getCustomer({ path: { id: "ada" } })).external_id, "ada");
  assert.equal((await client.createCustomer({ body: { external_id: "ada" } })).external_id, "ada");
  await assert.rejects(client.deleteCustomer({ path: { id: "ada" } }), (err) => !(err instanceof CreditdProblem));
  assert.deepEqual(seen, { GET: 2, POST: 2, DELETE: 1 });
});

test("paginate follows next_cursor page after page", async (t) => {
  const page = (ids, next) => JSON.stringify({ data: ids.map((id) => ({ ...customer, external_id: id })), pagination: { has_more: next !== null, next_cursor: next } });
  const s = await script(t, [[200, {}, page(["a", "b"], "c1")], [200, {}, page(["c"], null)]]);
  const client = createClient({ baseUrl: s.url, apiKey: "k" });
  const got = [];
  for await (const cust of client.paginate("listCustomers", { query: { limit: 2 } })) got.push(cust.external_id);
  assert.deepEqual(got, ["a", "b", "c"]);
  assert.deepEqual(s.got.map((r) => r.url), ["/v1/customers?limit=2", "/v1/customers?limit=2&cursor=c1"]);
});
