// Entitlement checks answered in the caller's process (issue 27 item 3),
// as the Go client's client/edge does: an Evaluator keeps the snapshots
// of the customers it is asked about, follows the tenant's change stream
// (GET /v1/changes/stream) to drop what a change made stale, and answers
// check() from memory with the HTTP check's fields plus the answer's age.
//
// Answered from memory: boolean and static metrics, and metered metrics
// priced flat or per unit. Gauges (their counts change without an event),
// tiered prices (a snapshot carries the price of one unit only) and metrics
// the snapshot does not list go to the HTTP check every time.
import type { CreditdClient, Schemas } from "./client.js";
import { Escrow, type Charge, type EscrowOptions, type EscrowStats } from "./escrow.js";

type Snapshot = Schemas["Snapshot"];
type CheckResult = Schemas["CheckResult"];

/** One message of the tenant's change stream. */
export interface ChangeEvent {
  /** The cursor after this message (opaque): give the last one to resume. */
  id: string;
  /** An event type of the log, a `change.*` type, `open` or `reset`. */
  type: string;
  /** The message's JSON body. */
  data: unknown;
}

/** Where and how to open the change stream. */
export interface ChangeStreamOptions {
  baseUrl: string;
  apiKey: string;
  /** Resume after this cursor ("" or unset: from now). */
  lastEventId?: string;
  signal?: AbortSignal;
  /** Hears each heartbeat's lag: every change made up to lag ms before it was sent. */
  onHeartbeat?: (lagMs: number) => void;
  fetch?: typeof fetch;
}

/**
 * Opens GET /v1/changes/stream and yields its messages until the server
 * ends it or the signal aborts. A refusal throws the problem's status and
 * body as an Error. Sent once, never retried: the caller resumes with the
 * last id.
 */
export async function* streamChanges(o: ChangeStreamOptions): AsyncGenerator<ChangeEvent, void, undefined> {
  const headers: Record<string, string> = { "X-API-Key": o.apiKey, Accept: "text/event-stream" };
  if (o.lastEventId) headers["Last-Event-ID"] = o.lastEventId;
  const res = await (o.fetch ?? globalThis.fetch)(o.baseUrl.replace(/\/+$/, "") + "/v1/changes/stream", {
    headers,
    signal: o.signal,
  });
  if (!res.ok || !res.body) {
    throw new Error(`creditd: GET /v1/changes/stream: ${res.status} ${(await res.text()).slice(0, 200)}`);
  }
  const decoder = new TextDecoder();
  let buf = "";
  let ev: ChangeEvent = { id: "", type: "", data: undefined };
  let seen = false;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (seen) yield ev;
        ev = { id: "", type: "", data: undefined };
        seen = false;
      } else if (line.startsWith(": heartbeat")) {
        const ms = Number.parseInt(line.slice(": heartbeat".length).trim(), 10);
        o.onHeartbeat?.(Number.isFinite(ms) && ms > 0 ? ms : 0);
      } else if (line.startsWith(":")) {
        // a comment (": behind"): vouches for nothing
      } else if (line.startsWith("id: ")) {
        ev.id = line.slice(4);
        seen = true;
      } else if (line.startsWith("event: ")) {
        ev.type = line.slice(7);
      } else if (line.startsWith("data: ")) {
        try {
          ev.data = JSON.parse(line.slice(6));
        } catch {
          ev.data = undefined;
        }
      }
    }
  }
}

/** What check() does when memory cannot answer within maxAgeMs. */
export type Fallback = "http" | "open" | "closed";

/** Settings of an Evaluator. */
export interface EvaluatorOptions {
  baseUrl: string;
  apiKey: string;
  /** Snapshots kept, least recently checked dropped first (default 10,000). */
  maxCustomers?: number;
  /** How old an answer from memory may be (default 3,000 ms). */
  maxAgeMs?: number;
  /** Past maxAgeMs or when creditd cannot be asked (default "http"). */
  fallback?: Fallback;
  /** The clock in ms (tests). */
  now?: () => number;
  /** Hears of stream and background fetch failures. */
  onError?: (err: unknown) => void;
  fetch?: typeof fetch;
  /** How consume() charges in memory (escrow.ts). */
  escrow?: EscrowOptions;
}

/** A check's answer: the HTTP check's fields, its age and where it came from. */
export type Answer = CheckResult & {
  /** How long before the answer its figures were known current, in ms. */
  ageMs: number;
  source: "memory" | "http" | "policy";
};

interface Entry {
  id: string;
  refs: string[];
  snap?: Snapshot;
  policy: string; // the customer's own overage policy, "" for the tenant's
  at: number;
  epoch: number;
  stale: boolean;
}

const reconnectMinMs = 100;
const reconnectMaxMs = 5_000;

/**
 * Answers checks from memory. start() follows the change stream; close()
 * stops it. The first check of a customer fetches its snapshot.
 */
export class Evaluator {
  private readonly c: CreditdClient;
  private readonly o: Required<Pick<EvaluatorOptions, "maxCustomers" | "maxAgeMs" | "fallback" | "now">> & EvaluatorOptions;
  // byId holds the snapshots in LRU order (Map iteration is insertion
  // order: a check re-inserts); refs maps every id asked under to its entry.
  private readonly byId = new Map<string, Entry>();
  private readonly refs = new Map<string, Entry>();
  // epoch moves on every change that may alter any customer's check.
  private epoch = 0;
  private tenantPolicy = "";
  private cursor = "";
  private up = false;
  private beat = 0;
  // events counts customer events; recent remembers, while fetches run,
  // the count at each customer's last one, so a fetch that raced an event
  // is not kept as current.
  private events = 0;
  private fetching = 0;
  private readonly recent = new Map<string, number>();
  private readonly flights = new Map<string, Promise<Entry>>();
  private abort?: AbortController;
  private loop?: Promise<void>;
  private escrow?: Escrow;

  constructor(client: CreditdClient, options: EvaluatorOptions) {
    this.c = client;
    this.o = {
      ...options,
      maxCustomers: options.maxCustomers && options.maxCustomers > 0 ? options.maxCustomers : 10_000,
      maxAgeMs: options.maxAgeMs && options.maxAgeMs > 0 ? options.maxAgeMs : 3_000,
      fallback: options.fallback ?? "http",
      now: options.now ?? Date.now,
    };
  }

  /** Follows the change stream until close(). */
  start(): void {
    this.abort = new AbortController();
    this.loop = this.follow(this.abort.signal);
  }

  /** Settles what consume() charged and returns its holds, then stops the stream. */
  async close(): Promise<void> {
    await this.escrow?.close();
    this.abort?.abort();
    await this.loop;
  }

  /**
   * Charges units of metric to customer in memory against an allowance (a
   * reservation this evaluator holds and settles every interval), or asks
   * creditd when no allowance can cover them: escrow.ts.
   */
  consume(customer: string, metric: string, units = 1): Promise<Charge> {
    this.escrow ??= new Escrow(this.c, { onError: this.o.onError, ...this.o.escrow });
    return this.escrow.consume(customer, metric, units);
  }

  /** What consume() did so far. */
  escrowStats(): EscrowStats | undefined {
    return this.escrow?.stats();
  }

  /** Whether the change stream is open. */
  get streamUp(): boolean {
    return this.up;
  }

  /** How many customers are kept. */
  get size(): number {
    return this.byId.size;
  }

  /**
   * Whether customer (own or external id) may use metric for units now, as
   * GET /v1/customers/{id}/entitlements/{metric} would answer.
   */
  async check(customer: string, metric: string, units = 1): Promise<Answer> {
    if (units < 1) units = 1;
    let en = this.refs.get(customer);
    if (!en || !this.current(en)) {
      try {
        en = await this.fetchShared(customer);
      } catch (err) {
        if (this.o.fallback === "http") throw err;
        return this.policyAnswer({ billable_metric_key: metric } as CheckResult, 0);
      }
    } else {
      this.touch(en);
    }
    const age = this.ageOf(en);
    const res = local(en.snap!, en.policy || this.tenantPolicy, metric, units);
    if (!res) return this.viaHttp(customer, metric, units);
    if (age <= this.o.maxAgeMs) return { ...res, ageMs: age, source: "memory" };
    if (this.o.fallback === "http") return this.viaHttp(customer, metric, units);
    return this.policyAnswer(res, age);
  }

  private current(en: Entry): boolean {
    return !!en.snap && !en.stale && en.epoch === this.epoch && (en.policy !== "" || this.tenantPolicy !== "");
  }

  // ageOf is how long ago en's figures were last known current: its fetch,
  // or the moment the stream's last heartbeat vouches for, when later.
  private ageOf(en: Entry): number {
    const known = this.up && this.beat > en.at ? this.beat : en.at;
    return Math.max(this.o.now() - known, 0);
  }

  private touch(en: Entry): void {
    this.byId.delete(en.id);
    this.byId.set(en.id, en);
  }

  private async viaHttp(customer: string, metric: string, units: number): Promise<Answer> {
    try {
      const res = (await this.c.checkCustomerEntitlement({ path: { id: customer, metric }, query: { units } })) as CheckResult;
      return { ...res, ageMs: 0, source: "http" };
    } catch (err) {
      const status = (err as { status?: number }).status;
      if ((status !== undefined && status < 500) || this.o.fallback === "http") throw err;
      return this.policyAnswer({ billable_metric_key: metric } as CheckResult, 0);
    }
  }

  private policyAnswer(res: CheckResult, age: number): Answer {
    return { ...res, allowed: this.o.fallback === "open", ageMs: age, source: "policy" };
  }

  // fetchShared fetches ref once for every caller that needs it at the
  // same time; a waiter whose leader failed fetches on its own.
  private async fetchShared(ref: string): Promise<Entry> {
    const flying = this.flights.get(ref);
    if (flying) {
      try {
        return await flying;
      } catch {
        return this.fetch(ref);
      }
    }
    const p = this.fetch(ref);
    this.flights.set(ref, p);
    try {
      return await p;
    } finally {
      this.flights.delete(ref);
    }
  }

  // fetch reads ref's snapshot and overage policy (and the tenant's
  // default, when not known) and keeps them; a change that arrived while it
  // ran leaves the entry stale, so the next check fetches again.
  private async fetch(ref: string): Promise<Entry> {
    const start = this.o.now();
    const epoch = this.epoch;
    const events = this.events;
    const needTenant = this.tenantPolicy === "";
    this.fetching++;
    try {
      const snap = (await this.c.entitlementSnapshot({ path: { id: ref }, headers: { "Cache-Control": "no-cache" } })) as Snapshot;
      const cust = (await this.c.getCustomer({ path: { id: snap.customer_id } })) as Schemas["Customer"];
      let tenantPolicy = "";
      if (needTenant) tenantPolicy = ((await this.c.getTenant()) as Schemas["TenantConfig"]).default_overage_policy;
      if (tenantPolicy && this.epoch === epoch) this.tenantPolicy = tenantPolicy;
      let en = this.byId.get(snap.customer_id);
      if (!en) {
        en = { id: snap.customer_id, refs: [], policy: "", at: 0, epoch: 0, stale: true };
        this.byId.set(en.id, en);
        this.evict();
      } else {
        this.touch(en);
      }
      const old = this.refs.get(ref);
      if (old !== en) {
        if (old) old.refs = old.refs.filter((r) => r !== ref);
        this.refs.set(ref, en);
        en.refs.push(ref);
      }
      en.snap = snap;
      en.at = start;
      en.epoch = epoch;
      en.policy = cust.overage_policy ?? "";
      en.stale = this.epoch !== epoch || (this.recent.get(snap.customer_id) ?? 0) > events || (needTenant && !tenantPolicy);
      return en;
    } finally {
      if (--this.fetching === 0) this.recent.clear();
    }
  }

  private evict(): void {
    for (const [id, en] of this.byId) {
      if (this.byId.size <= this.o.maxCustomers) return;
      this.byId.delete(id);
      for (const r of en.refs) if (this.refs.get(r) === en) this.refs.delete(r);
    }
  }

  private async follow(signal: AbortSignal): Promise<void> {
    let wait = reconnectMinMs;
    while (!signal.aborted) {
      const from = this.cursor;
      try {
        for await (const ev of streamChanges({
          baseUrl: this.o.baseUrl,
          apiKey: this.o.apiKey,
          lastEventId: from,
          signal,
          fetch: this.o.fetch,
          onHeartbeat: (lag) => {
            const at = this.o.now() - lag;
            if (this.up && at > this.beat) this.beat = at;
          },
        })) {
          wait = reconnectMinMs;
          this.apply(ev, from === "");
        }
      } catch (err) {
        if (signal.aborted) return;
        this.o.onError?.(err);
        await pause(wait, signal);
        wait = Math.min(wait * 2, reconnectMaxMs);
        continue;
      } finally {
        this.up = false;
      }
      await pause(reconnectMinMs, signal);
    }
  }

  // apply takes one message; fresh is true on a stream opened without a
  // cursor (it starts now, so what was fetched before it is not covered).
  private apply(ev: ChangeEvent, fresh: boolean): void {
    if (ev.type === "open") {
      this.up = true;
      if (fresh) this.epoch++;
    } else if (ev.type === "reset") {
      this.up = true;
      this.epoch++;
      this.tenantPolicy = "";
    } else if (ev.type === "change.holds" || !ev.type.startsWith("change.")) {
      this.customerChanged(ev.data);
    } else {
      // The stamps say which kind of facts changed, not whose.
      this.epoch++;
      if (ev.type === "change.tenant") this.tenantPolicy = "";
    }
    if (ev.id) this.cursor = ev.id;
  }

  private customerChanged(data: unknown): void {
    const id = (data as { customer_id?: unknown } | undefined)?.customer_id;
    if (typeof id !== "string" || !id) return;
    this.events++;
    if (this.fetching > 0) this.recent.set(id, this.events);
    const en = this.byId.get(id);
    if (!en) return;
    en.stale = true;
    const ref = en.refs[0];
    if (ref) void this.fetchShared(ref).catch((err) => this.o.onError?.(err));
  }
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
  });
}

/**
 * Answers a check from a snapshot; undefined when it cannot (the metric is
 * not listed, a gauge, a tiered or unpriced rule, a cost past 2^53, the
 * overage policy unknown).
 */
export function local(snap: Snapshot, policy: string, metric: string, units: number): CheckResult | undefined {
  const se = snap.entitlements[metric] as Record<string, unknown> | undefined;
  if (!se) return undefined;
  const res = {
    type: se.type,
    customer_id: snap.customer_id,
    billable_metric_key: metric,
    subscription_status: snap.subscription_status ?? null,
  } as Record<string, unknown>;
  switch (se.type) {
    case "boolean":
      if (typeof se.enabled !== "boolean") return undefined;
      res.enabled = se.enabled;
      res.allowed = se.enabled;
      break;
    case "static":
      res.config = se.config;
      res.allowed = true;
      break;
    case "metered": {
      const per = se.estimated_cost_per_unit;
      if (typeof per !== "number" || !policy) return undefined;
      let cost: number;
      if (se.cost_type === "flat") cost = per;
      else if (se.cost_type === "per_unit") cost = per * units;
      else return undefined;
      if (!Number.isSafeInteger(cost) || per < 0) return undefined;
      const eff = snap.effective_balance;
      const after = eff - cost;
      if (!Number.isSafeInteger(after)) return undefined;
      // What the customer may spend: the effective balance plus its credit
      // line under block (the snapshot's available_mc, docs/rules.md
      // "Credit line"); a snapshot without it predates the line.
      // An account holding scoped blocks: the entry's own available_mc, what
      // this metric may spend (docs/rules.md "Credits scoped to metrics").
      const avail =
        typeof se.available_mc === "number"
          ? se.available_mc
          : typeof snap.available_mc === "number"
            ? snap.available_mc
            : eff;
      // The snapshot's allowed is the one-unit check with the plan's denial
      // folded in: refused although one unit fits (or the policy lets it
      // through) means the plan or an overdue subscription denies it.
      const denied = !se.allowed && (per <= avail || policy !== "block");
      res.allowed = (cost <= avail || policy !== "block") && !denied;
      Object.assign(res, {
        units,
        balance: snap.balance,
        reserved_balance: snap.reserved_balance,
        pending_balance: snap.pending_balance,
        effective_balance: eff,
        credit_limit_mc: snap.credit_limit_mc ?? 0,
        available_mc: avail,
        estimated_cost: cost,
        balance_after: after,
        overage_policy: policy,
      });
      break;
    }
    default:
      return undefined;
  }
  return res as CheckResult;
}
