// The client against a real creditd: CREDITD_URL and CREDITD_ADMIN_TOKEN
// name it (client/typescript_test.go starts one and runs `npm test` with
// them). Without them these tests are skipped.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createClient, Evaluator, isProblem, parseWebhook } from "../dist/index.js";

const base = process.env.CREDITD_URL;
const adminToken = process.env.CREDITD_ADMIN_TOKEN;
const skip = !base || !adminToken ? "CREDITD_URL and CREDITD_ADMIN_TOKEN are not set (client/typescript_test.go sets them)" : false;

async function admin(method, path, body) {
  const res = await fetch(base + path, {
    method,
    headers: { Authorization: `Bearer ${adminToken}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const out = await res.json();
  assert.ok(res.ok, `${method} ${path}: ${res.status} ${JSON.stringify(out)}`);
  return out;
}

let c;
let apiKey;
let secret;
const deliveries = [];
let receiver;

before(async () => {
  if (skip) return;
  const tenant = await admin("POST", "/admin/v1/tenants", { name: `ts-client-${Date.now()}` });
  receiver = createServer((req, res) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      deliveries.push({ headers: req.headers, body });
      res.end();
    });
  });
  await new Promise((r) => receiver.listen(0, "127.0.0.1", r));
  const hook = await admin("PUT", `/admin/v1/tenants/${tenant.tenant.id}/webhook`, { url: `http://127.0.0.1:${receiver.address().port}/hooks` });
  secret = hook.secret;
  apiKey = tenant.api_keys.live;
  c = createClient({ baseUrl: base, apiKey });
});

after(() => receiver?.close());

test("customers", { skip }, async () => {
  const ada = await c.createCustomer({ body: { external_id: "ada", display_name: "Ada", metadata: { tier: "gold" } } });
  assert.equal(ada.external_id, "ada");
  assert.equal(ada.environment, "live");
  assert.equal((await c.getCustomer({ path: { id: ada.id } })).id, ada.id);
  assert.equal((await c.getCustomerStrict({ path: { external_id: "ada" } })).id, ada.id);
  const up = await c.updateCustomer({ path: { id: "ada" }, body: { overage_policy: "block" } });
  assert.equal(up.overage_policy, "block");
  await c.createCustomer({ body: { external_id: "bob" } });
  const page = await c.listCustomers({ query: { limit: 1 } });
  assert.equal(page.data.length, 1);
  assert.equal(page.pagination.has_more, true);
  const walked = [];
  for await (const cust of c.paginate("listCustomers", { query: { limit: 1 } })) walked.push(cust.external_id);
  assert.deepEqual(walked, ["bob", "ada"]);
  assert.equal(await c.deleteCustomer({ path: { id: "bob" } }), undefined);
  await assert.rejects(c.getCustomer({ path: { id: "bob" } }), (err) => isProblem(err, "not-found") && err.status === 404 && err.requestId !== "");
  await assert.rejects(c.createCustomer({ body: {} }), (err) => isProblem(err, "validation-error") && err.field === "external_id");
});

test("credits, replay and topups", { skip }, async () => {
  let first, again;
  const g = await c.grantCredits({ path: { id: "ada" }, body: { credits: 10_000, source: "promotional", reason: "welcome" }, onResponse: (i) => (first = i) });
  assert.equal(g.account.balance, 10_000);
  assert.equal(first.replayed, false);
  const g2 = await c.grantCredits({ path: { id: "ada" }, body: { credits: 10_000, source: "promotional", reason: "welcome" }, idempotencyKey: first.idempotencyKey, onResponse: (i) => (again = i) });
  assert.equal(again.replayed, true);
  assert.equal(g2.transaction.id, g.transaction.id);
  const adj = await c.adjustCredits({ path: { id: "ada" }, body: { delta: -1_000, source: "manual", reason: "fix" } });
  assert.equal(adj.block, null);
  assert.equal(adj.account.balance, 9_000);
  await assert.rejects(
    c.adjustCredits({ path: { id: "ada" }, body: { delta: -1_000_000, source: "manual", reason: "too much" } }),
    (err) => isProblem(err, "insufficient-credits") && err.status === 409,
  );
  const top = await c.createTopup({ path: { id: "ada" }, body: { credits: 3_000, payment_reference: "pi_1" } });
  assert.equal(top.account.balance, 12_000);
  const acct = await c.getCredits({ path: { id: "ada" }, query: { include_blocks: "true" } });
  assert.equal(acct.balance, 12_000);
  assert.ok(acct.blocks.length >= 2);
});

test("pricing, entitlements and reservations", { skip }, async () => {
  await c.createMeteringRule({ body: { billable_metric_key: "api_calls", cost_type: "per_unit", unit_cost: 100 } });
  const chk = await c.checkEntitlement({ query: { customer_id: "ada", billable_metric_key: "api_calls", units: 3 } });
  assert.equal(chk.allowed, true);
  assert.equal(chk.estimated_cost, 300);
  const con = await c.consume({ body: { customer_id: "ada", billable_metric_key: "api_calls", units: 2 } });
  assert.equal(con.charged, 200);
  assert.equal(con.billable_metric_key, "api_calls");
  assert.equal(con.units, 2);
  await c.createBillableMetric({ body: { key: "seats", type: "gauge", default_value: { cap: 5 } } });
  const inc = await c.incrementGauge({ path: { id: "ada", billable_metric_key: "seats" }, body: { amount: 3 } });
  assert.equal(inc.current, 3);
  await assert.rejects(
    c.incrementGauge({ path: { id: "ada", billable_metric_key: "seats" }, body: { amount: 10 } }),
    (err) => isProblem(err, "conflict") && err.current === 3 && err.cap === 5 && err.shortfall === 8,
  );
  const snap = await c.entitlementSnapshot({ path: { id: "ada" }, headers: { "Cache-Control": "no-cache" } });
  assert.equal(snap.entitlements.seats.current, 3);
  const hold = await c.createReservation({ body: { customer_id: "ada", billable_metric_key: "api_calls", estimated_units: 10 } });
  assert.equal(hold.status, "active");
  assert.equal(hold.estimated_cost, 1_000);
  const com = await c.commitReservation({ path: { id: hold.id }, body: { actual_units: 4 } });
  assert.equal(com.status, "committed");
  assert.equal(com.actual_cost, 400);
  const hold2 = await c.createReservation({ body: { external_customer_id: "ada", billable_metric_key: "api_calls", estimated_units: 1 } });
  const rel = await c.releaseReservation({ path: { id: hold2.id } });
  assert.equal(rel.status, "released");
  const holds = await c.listCustomerReservations({ path: { customer_id: "ada" } });
  assert.equal(holds.data.length, 2);
});

test("plans and subscriptions", { skip }, async () => {
  const plan = await c.createPlan({ body: { name: "Pro" } });
  const v = await c.createPlanVariant({ path: { id: plan.id }, body: { billing_cycle: "monthly" } });
  await c.createPlanGrant({ path: { id: plan.id, vid: v.id }, body: { credits: 1_000, grant_interval: "billing_period", grant_type: "recurring" } });
  const detail = await c.getPlanVariant({ path: { id: v.id } });
  assert.equal(detail.grants.length, 1);
  const sub = await c.createSubscription({ body: { customer_id: "ada", plan_variant_id: v.id } });
  assert.equal(sub.status, "active");
  const paused = await c.pauseSubscription({ path: { id: sub.id } });
  assert.equal(paused.status, "paused");
  const canceled = await c.cancelSubscription({ path: { id: sub.id } });
  assert.equal(canceled.status, "canceled");
});

test("webhooks: creditd's signature verifies", { skip }, async () => {
  const ping = await c.testWebhook();
  assert.equal(ping.event_type, "test.ping");
  const deadline = Date.now() + 20_000;
  let d;
  while (!(d = deliveries.find((x) => x.headers["webhook-id"] === ping.event_id)) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.ok(d, "the test.ping was delivered");
  const payload = parseWebhook(secret, d.headers, d.body);
  assert.equal(payload.event_id, ping.event_id);
  assert.equal(payload.event_type, "test.ping");
  assert.throws(() => parseWebhook(secret, d.headers, d.body + " "), (err) => err.reason === "signature");
  for (const x of deliveries) parseWebhook(secret, x.headers, x.body); // every delivery verifies
  const events = await c.listWebhookEvents({ query: { event_type: "test.ping" } });
  assert.equal(events.data[0].id, ping.event_id);
});

test("events: the log pages by sequence, no gap", { skip }, async () => {
  const page = await c.listEvents({ query: { after_sequence: 0, limit: 100 } });
  assert.ok(page.data.length > 0, "events were listed");
  page.data.forEach((e, i) => assert.equal(e.sequence, i + 1));
  const rest = await c.listEvents({ query: { after_sequence: page.data.length } });
  assert.equal(rest.data.length === 0 || rest.data[0].sequence === page.data.length + 1, true);
});

test("edge: the evaluator answers as the HTTP check from memory and hears a grant", { skip }, async (t) => {
  await c.createMeteringRule({ body: { billable_metric_key: "edge_calls", cost_type: "per_unit", unit_cost: 10 } });
  await c.createCustomer({ body: { external_id: "eve" } });
  await c.grantCredits({ path: { id: "eve" }, body: { credits: 1_000, source: "promotional", reason: "edge" } });
  const ev = new Evaluator(c, { baseUrl: base, apiKey });
  ev.start();
  t.after(() => ev.close());
  const deadline = Date.now() + 10_000;
  while (!ev.streamUp && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.ok(ev.streamUp, "the change stream opened");

  const got = await ev.check("eve", "edge_calls", 30);
  assert.equal(got.source, "memory");
  const { ageMs, source, ...fields } = got;
  const http = await c.checkCustomerEntitlement({ path: { id: "eve", metric: "edge_calls" }, query: { units: 30 } });
  assert.deepEqual(fields, http, "memory answers the HTTP check's fields");

  await c.grantCredits({ path: { id: "eve" }, body: { credits: 1_000, source: "promotional", reason: "edge 2" } });
  let after;
  while (Date.now() < deadline) {
    after = await ev.check("eve", "edge_calls", 30);
    if (after.effective_balance === 2_000) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(after.effective_balance, 2_000, "the grant reached the evaluator");
  assert.equal(after.source, "memory");
});


test("edge: consumes in memory settle exactly, and stop at the balance under block", { skip }, async () => {
  await c.createMeteringRule({ body: { billable_metric_key: "esc_calls", cost_type: "per_unit", unit_cost: 2 } });
  await c.createCustomer({ body: { external_id: "fred" } });
  await c.grantCredits({ path: { id: "fred" }, body: { credits: 10_000, source: "promotional", reason: "escrow" } });
  const ev = new Evaluator(c, { baseUrl: base, apiKey, escrow: { settleIntervalMs: 50 } });
  let local = 0;
  for (let i = 0; i < 2_000; i++) {
    const ch = await ev.consume("fred", "esc_calls", 1);
    assert.equal(ch.cost, 2);
    if (ch.local) local++;
  }
  assert.ok(local > 1_000, `${local} of 2000 consumes charged in memory`);
  await ev.close();
  const st = ev.escrowStats();
  assert.equal(st.settledUnits, st.consumedLocalUnits, "every local unit settled");
  assert.equal(st.atRiskUnits, 0);
  assert.equal(st.consumedLocalUnits + st.httpUnits, 2_000);
  const acct = await c.getCredits({ path: { id: "fred" } });
  assert.equal(acct.balance, 10_000 - 2 * 2_000, "the ledger has every unit once");
  assert.equal(acct.reserved_balance, 0, "the hold was returned");

  // Under block: never past the balance.
  await c.createCustomer({ body: { external_id: "gus", overage_policy: "block" } });
  await c.grantCredits({ path: { id: "gus" }, body: { credits: 100, source: "promotional", reason: "escrow" } });
  const ev2 = new Evaluator(c, { baseUrl: base, apiKey, escrow: { settleIntervalMs: 50, maxWaitMs: 200 } });
  let charged = 0;
  let refused = 0;
  for (let i = 0; i < 200 && refused < 3; i++) {
    try {
      charged += (await ev2.consume("gus", "esc_calls", 1)).units;
    } catch (err) {
      assert.ok(isProblem(err, "insufficient-credits"), String(err));
      refused++;
    }
  }
  await ev2.close();
  assert.ok(refused > 0, "the balance ran out");
  assert.ok(charged <= 50, `${charged} units at 2 charged from 100`);
  const g = await c.getCredits({ path: { id: "gus" } });
  assert.equal(g.balance, 100 - 2 * charged, "every charged unit is in the ledger once");
  assert.ok(g.balance >= 0);
  assert.equal(g.reserved_balance, 0);
});
