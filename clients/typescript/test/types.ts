// Compile-time checks of the client's types (`npm test` runs tsc on this
// file with noEmit): each @ts-expect-error line must be a type error.
import { createClient, isProblem, type Schemas } from "../src/index.js";

const c = createClient({ baseUrl: "http://127.0.0.1:1", apiKey: "k" });

export async function typed(): Promise<void> {
  const g = await c.grantCredits({ path: { id: "ada" }, body: { credits: 1, source: "manual", reason: "r" } });
  const balance: number = g.account.balance;
  const block: Schemas["Block"] = g.block;
  // @ts-expect-error the body is required
  await c.grantCredits({ path: { id: "ada" } });
  // @ts-expect-error source is an enum
  await c.grantCredits({ path: { id: "ada" }, body: { credits: 1, source: "gift", reason: "r" } });
  // @ts-expect-error the path is required
  await c.getCustomer();
  const tenant = await c.getTenant();
  const name: string = tenant.name;
  await c.listCustomers();
  await c.listCustomers({ query: { limit: 5 } });
  // @ts-expect-error limit is a number
  await c.listCustomers({ query: { limit: "5" } });
  await c.checkEntitlement({ query: { customer_id: "ada", billable_metric_key: "api_calls" } });
  // @ts-expect-error customer_id is a required query parameter
  await c.checkEntitlement({ query: { billable_metric_key: "api_calls" } });
  await c.cancelSubscription({ path: { id: "s" } });
  await c.cancelSubscription({ path: { id: "s" }, body: { at_period_end: true } });
  const gone: undefined = await c.deleteCustomer({ path: { id: "ada" } });
  const ping = await c.call("testWebhook", { idempotencyKey: "k1" });
  const pingType: "test.ping" = ping.event_type;
  try {
    const con = await c.consume({ body: { customer_id: "ada", billable_metric_key: "api_calls", units: 1 } });
    // billable_metric_key and units are null for the items form.
    const metric: string | null = con.billable_metric_key;
    const units: number | null = con.units;
    // @ts-expect-error billable_metric_key may be null
    const metricOnly: string = con.billable_metric_key;
    // @ts-expect-error units may be null
    const unitsOnly: number = con.units;
    void [metric, units, metricOnly, unitsOnly];
  } catch (err) {
    if (isProblem(err, "insufficient-credits")) {
      const status: number = err.status;
      void status;
    }
  }
  for await (const entry of c.paginate("creditHistory", { path: { id: "ada" }, query: { limit: 50 } })) {
    const delta: number = entry.delta;
    void delta;
  }
  // @ts-expect-error getTenant does not page
  c.paginate("getTenant");
  void [balance, block, name, gone, pingType];
}
