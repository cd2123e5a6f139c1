// The evaluator's local answers, the change stream's parsing and the
// evaluator's fetch, memory and refetch against a scripted local server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createClient, Evaluator, local, streamChanges } from "../dist/index.js";

const cust = "7b0c5a4e-4f5e-4a0e-9a57-1f0b3c1d2e3f";

function snapshot(balance, entitlements) {
  return {
    customer_id: cust,
    environment: "live",
    balance,
    reserved_balance: 0,
    pending_balance: 0,
    effective_balance: balance,
    subscription_status: null,
    plan_name: null,
    entitlements,
    cached_at: "2026-01-02T03:04:05.678Z",
  };
}

const metered = (per, allowed = true, costType = "per_unit") => ({
  type: "metered",
  billable_metric_key: "m",
  allowed,
  estimated_cost_per_unit: per,
  affordable_units: 0,
  cost_type: costType,
});

test("local answers a snapshot's metrics as the HTTP check would", () => {
  const cases = [
    { name: "per unit fits", snap: snapshot(100, { m: metered(10) }), policy: "block", units: 10, want: { allowed: true, estimated_cost: 100, balance_after: 0 } },
    { name: "per unit past the balance under block", snap: snapshot(100, { m: metered(10) }), policy: "block", units: 11, want: { allowed: false, balance_after: -10 } },
    { name: "past the balance under allow", snap: snapshot(100, { m: metered(10) }), policy: "allow", units: 11, want: { allowed: true } },
    { name: "flat ignores units", snap: snapshot(5, { m: metered(5, true, "flat") }), policy: "block", units: 9, want: { allowed: true, estimated_cost: 5 } },
    { name: "the plan denies it", snap: snapshot(100, { m: metered(10, false) }), policy: "block", units: 1, want: { allowed: false } },
    { name: "boolean", snap: snapshot(0, { f: { type: "boolean", billable_metric_key: "f", allowed: false, enabled: false } }), metric: "f", policy: "block", units: 1, want: { allowed: false, enabled: false } },
    { name: "static", snap: snapshot(0, { s: { type: "static", billable_metric_key: "s", allowed: true, config: { seats: 3 } } }), metric: "s", policy: "block", units: 1, want: { allowed: true, config: { seats: 3 } } },
    { name: "tiered goes to HTTP", snap: snapshot(100, { m: metered(10, true, "tiered") }), policy: "block", units: 1, want: undefined },
    { name: "gauge goes to HTTP", snap: snapshot(0, { g: { type: "gauge", billable_metric_key: "g", allowed: true } }), metric: "g", policy: "block", units: 1, want: undefined },
    { name: "unknown metric goes to HTTP", snap: snapshot(0, {}), policy: "block", units: 1, want: undefined },
    { name: "policy unknown goes to HTTP", snap: snapshot(100, { m: metered(10) }), policy: "", units: 1, want: undefined },
    { name: "cost past 2^53 goes to HTTP", snap: snapshot(100, { m: metered(2 ** 52) }), policy: "block", units: 4, want: undefined },
  ];
  for (const tc of cases) {
    const got = local(tc.snap, tc.policy, tc.metric ?? "m", tc.units);
    if (tc.want === undefined) {
      assert.equal(got, undefined, tc.name);
      continue;
    }
    assert.ok(got, tc.name);
    for (const [k, v] of Object.entries(tc.want)) assert.deepEqual(got[k], v, `${tc.name}: ${k}`);
  }
});

// fakeCreditd serves the snapshot, the customer, the tenant and a change
// stream whose messages the test pushes; it counts snapshot fetches.
async function fakeCreditd(t) {
  const state = { balance: 100, snapshots: 0, streams: [], lastEventIds: [] };
  const srv = createServer((req, res) => {
    const url = new URL(req.url, "http://x");
    if (url.pathname === "/v1/changes/stream") {
      state.lastEventIds.push(req.headers["last-event-id"] ?? "");
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write("id: 0.0\nevent: open\ndata: {}\n\n");
      state.streams.push(res);
      return;
    }
    res.setHeader("Content-Type", "application/json");
    if (url.pathname === `/v1/customers/${cust}/entitlements` || url.pathname === "/v1/customers/ada/entitlements") {
      state.snapshots++;
      res.end(JSON.stringify(snapshot(state.balance, { m: metered(10) })));
    } else if (url.pathname === `/v1/customers/${cust}`) {
      res.end(JSON.stringify({ id: cust, overage_policy: null }));
    } else if (url.pathname === "/v1/tenant") {
      res.end(JSON.stringify({ default_overage_policy: "block" }));
    } else {
      res.statusCode = 404;
      res.end(JSON.stringify({ type: "not-found", title: "Not Found", status: 404, detail: url.pathname }));
    }
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => {
    for (const s of state.streams) s.destroy();
    srv.close();
  });
  state.url = `http://127.0.0.1:${srv.address().port}`;
  state.push = (msg) => {
    for (const s of state.streams) s.write(msg);
  };
  return state;
}

async function until(what, cond, ms = 3000) {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

test("streamChanges yields messages, skips comments and reports heartbeats", async (t) => {
  const srv = await fakeCreditd(t);
  const lags = [];
  const ac = new AbortController();
  const it = streamChanges({ baseUrl: srv.url, apiKey: "k", lastEventId: "7.1-0", signal: ac.signal, onHeartbeat: (l) => lags.push(l) });
  const first = await it.next();
  assert.deepEqual(first.value, { id: "0.0", type: "open", data: {} });
  srv.push(": behind\n\n: heartbeat 42\n\nid: 8.1-0\nevent: credit.granted\ndata: {\"customer_id\":\"c\"}\n\n");
  const second = await it.next();
  assert.deepEqual(second.value, { id: "8.1-0", type: "credit.granted", data: { customer_id: "c" } });
  assert.deepEqual(lags, [42]);
  assert.deepEqual(srv.lastEventIds, ["7.1-0"]);
  await it.return();
  ac.abort();
});

test("the evaluator fetches once, answers from memory and refetches after a customer's event", async (t) => {
  const srv = await fakeCreditd(t);
  const c = createClient({ baseUrl: srv.url, apiKey: "k" });
  const ev = new Evaluator(c, { baseUrl: srv.url, apiKey: "k" });
  ev.start();
  t.after(() => ev.close());
  await until("the stream", () => ev.streamUp);

  const a = await ev.check("ada", "m", 5);
  assert.equal(a.source, "memory");
  assert.equal(a.allowed, true);
  assert.equal(a.balance_after, 50);
  const b = await ev.check("ada", "m", 11);
  assert.equal(b.allowed, false, "11 units at 10 past 100 under block");
  assert.equal(srv.snapshots, 1, "the second check fetched nothing");

  srv.balance = 200;
  srv.push(`id: 1.0\nevent: credit.granted\ndata: {"customer_id":"${cust}"}\n\n`);
  await until("the refetch", () => srv.snapshots === 2);
  // The refetch answered: the entry is current again once its answer is kept.
  await until("the new balance", async () => (await ev.check("ada", "m", 11)).effective_balance === 200);
  assert.equal(srv.snapshots, 2, "the event's refetch, not a check, fetched the new figures");
  const c2 = await ev.check("ada", "m", 11);
  assert.equal(c2.allowed, true);
  assert.equal(c2.source, "memory");

  // A config change makes every snapshot stale: the next check fetches.
  srv.push("id: 1.1\nevent: change.plans\ndata: {}\n\n");
  await until("the config change", () => ev["epoch"] >= 2);
  await ev.check("ada", "m", 1);
  assert.equal(srv.snapshots, 3);
});

test("past maxAgeMs the fallback decides", async (t) => {
  const srv = await fakeCreditd(t);
  const c = createClient({ baseUrl: srv.url, apiKey: "k", maxAttempts: 1 });
  let now = 1_000_000;
  const cases = [
    { fallback: "open", allowed: true },
    { fallback: "closed", allowed: false },
  ];
  for (const tc of cases) {
    // No start(): no stream vouches for the figures, so they age.
    const ev = new Evaluator(c, { baseUrl: srv.url, apiKey: "k", fallback: tc.fallback, maxAgeMs: 1000, now: () => now });
    const fresh = await ev.check("ada", "m", 1);
    assert.equal(fresh.source, "memory", tc.fallback);
    now += 5000;
    const old = await ev.check("ada", "m", 1);
    assert.equal(old.source, "policy", tc.fallback);
    assert.equal(old.allowed, tc.allowed, tc.fallback);
    assert.equal(old.ageMs, 5000, tc.fallback);
  }
});
