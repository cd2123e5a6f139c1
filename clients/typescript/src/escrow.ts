// Consumes charged in the caller's process against an allowance (issue 27
// item 3), as client/edge/escrow.go does in Go: for a customer and a
// per_unit metric the Escrow holds an ordinary reservation, charges
// consumes in memory against it, settles what was used every interval with
// a partial commit ("final": false), tops the hold up or prolongs it with an
// extend, and on close() settles the rest with the final commit, which
// returns what is left. The server's books always include the whole hold, so
// nothing is overspent under block; a process that dies loses at most the
// usage of one settle interval (stats().atRiskUnits), and its hold expires
// by itself.
import type { CreditdClient, Schemas } from "./client.js";
import { CreditdProblem, isProblem } from "./client.js";

type Snapshot = Schemas["Snapshot"];

/** Settings of an Escrow. */
export interface EscrowOptions {
  /** How often what was used is settled (default 200 ms). */
  settleIntervalMs?: number;
  /** How much usage a hold covers, at the observed rate (default 500 ms). */
  horizonMs?: number;
  /** Bounds of a hold, in units (defaults 1 and 10,000). */
  minUnits?: number;
  maxUnits?: number;
  /** A hold's lifetime, prolonged while it is used (default 30 s). */
  holdTtlSeconds?: number;
  /** Past the allowance: wait up to maxWaitMs for a top-up, then ask creditd ("wait", default), or ask at once ("http"). */
  overflow?: "wait" | "http";
  maxWaitMs?: number;
  /** Hears of settle and top-up failures. */
  onError?: (err: unknown) => void;
}

/** What one consume charged. */
export interface Charge {
  units: number;
  /** Millicredits. */
  cost: number;
  /** True when charged in memory against the allowance. */
  local: boolean;
  /** creditd's answer when the consume went to the server. */
  result?: Schemas["ConsumeResult"];
}

/** What the Escrow did so far. */
export interface EscrowStats {
  consumedLocalUnits: number;
  settledUnits: number;
  /** Units charged locally and not yet settled: lost if the process dies now. */
  atRiskUnits: number;
  /** Units whose hold was gone before they settled. */
  uncollectedUnits: number;
  httpUnits: number;
  refusedUnits: number;
  allowances: number;
  settles: number;
  topUps: number;
  topUpsRefused: number;
}

/** consume() after close(). */
export class EscrowClosedError extends Error {
  constructor() {
    super("creditd: escrow closed");
    this.name = "EscrowClosedError";
  }
}

interface Allowance {
  key: string;
  customer: string; // the service id
  metric: string;
  perUnit: number;
  policy: string;
  id: string; // the reservation
  // held is what the hold covers in units beyond what was settled; used
  // what was charged locally and not yet sent; sending what a settle in
  // flight carries. What is left to charge is held - used - sending.
  held: number;
  used: number;
  sending: number;
  // A settle or extend that failed without an answer is sent again with
  // its key and body before anything newer.
  pendingSettle?: { key: string; units: number };
  busy: boolean;
  target: number;
  demand: number; // units asked this interval
  rate: number; // smoothed units per interval
  idleTicks: number;
  prolongedAt: number;
  refusedUntil: number;
  waiters: (() => void)[];
}

const newKey = () => globalThis.crypto.randomUUID();

/**
 * Charges per_unit metrics in memory against reservations it holds. Other
 * metrics (flat, tiered, not listed), consumes larger than maxUnits, and a
 * customer whose top-up creditd refused under a policy that allows overage
 * go to POST /v1/entitlements/consume.
 */
export class Escrow {
  private readonly o: Required<Omit<EscrowOptions, "onError">> & Pick<EscrowOptions, "onError">;
  private readonly allowances = new Map<string, Allowance>();
  private readonly opening = new Map<string, Promise<Allowance | undefined>>();
  private readonly s: EscrowStats = {
    consumedLocalUnits: 0,
    settledUnits: 0,
    atRiskUnits: 0,
    uncollectedUnits: 0,
    httpUnits: 0,
    refusedUnits: 0,
    allowances: 0,
    settles: 0,
    topUps: 0,
    topUpsRefused: 0,
  };
  private timer?: ReturnType<typeof setInterval>;
  private closed = false;

  constructor(
    private readonly c: CreditdClient,
    options: EscrowOptions = {},
  ) {
    this.o = {
      settleIntervalMs: options.settleIntervalMs ?? 200,
      horizonMs: options.horizonMs ?? 500,
      minUnits: options.minUnits ?? 1,
      maxUnits: options.maxUnits ?? 10_000,
      holdTtlSeconds: options.holdTtlSeconds ?? 30,
      overflow: options.overflow ?? "wait",
      maxWaitMs: options.maxWaitMs ?? 1_000,
      onError: options.onError,
    };
  }

  /** What the Escrow did so far. */
  stats(): EscrowStats {
    let atRisk = 0;
    for (const a of this.allowances.values()) atRisk += a.used + a.sending;
    return { ...this.s, atRiskUnits: atRisk, allowances: this.allowances.size };
  }

  /**
   * Charges units of metric to customer (own or external id): in memory when
   * an allowance covers them, else as overflow says. A refusal is the
   * CreditdProblem creditd would answer (insufficient-credits under block).
   */
  async consume(customer: string, metric: string, units = 1): Promise<Charge> {
    if (this.closed) throw new EscrowClosedError();
    if (!Number.isSafeInteger(units) || units < 1) throw new RangeError("units must be a whole number >= 1");
    const a = await this.allowanceOf(customer, metric, units);
    if (!a) return this.viaHttp(customer, metric, units);
    a.demand += units;
    if (this.take(a, units)) return { units, cost: units * a.perUnit, local: true };
    if (Date.now() < a.refusedUntil) return this.beyond(a, customer, units);
    void this.topUp(a, units);
    if (this.o.overflow === "wait") {
      const end = Date.now() + this.o.maxWaitMs;
      while (Date.now() < end && !this.closed) {
        await new Promise<void>((r) => {
          a.waiters.push(r);
          setTimeout(r, Math.max(end - Date.now(), 0));
        });
        if (this.take(a, units)) return { units, cost: units * a.perUnit, local: true };
        if (Date.now() < a.refusedUntil) return this.beyond(a, customer, units);
      }
    }
    return this.viaHttp(customer, metric, units);
  }

  /** Settles what was used, returns every hold and stops. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    await Promise.all([...this.opening.values()].map((p) => p.catch(() => undefined)));
    await Promise.all([...this.allowances.values()].map((a) => this.finish(a)));
  }

  private take(a: Allowance, units: number): boolean {
    if (a.held - a.used - a.sending < units) return false;
    a.used += units;
    this.s.consumedLocalUnits += units;
    return true;
  }

  // beyond answers a consume past an allowance whose top-up creditd refused:
  // under block the refusal creditd would give, else the server decides.
  private beyond(a: Allowance, customer: string, units: number): Promise<Charge> {
    if (a.policy === "block") {
      this.s.refusedUnits += units;
      throw new CreditdProblem(
        409,
        { type: "insufficient-credits", title: "Insufficient Credits", detail: "the effective balance is smaller than the cost (refused by the local allowance)" },
        "",
        0,
      );
    }
    return this.viaHttp(customer, a.metric, units);
  }

  private async viaHttp(customer: string, metric: string, units: number): Promise<Charge> {
    const result = (await this.c.consume({ body: { customer_id: customer, billable_metric_key: metric, units } })) as Schemas["ConsumeResult"];
    this.s.httpUnits += units;
    return { units, cost: result.cost, local: false, result };
  }

  // allowanceOf is the allowance of customer and metric, opened with a
  // hold on first use; undefined when the metric is not charged locally.
  private async allowanceOf(customer: string, metric: string, units: number): Promise<Allowance | undefined> {
    if (units > this.o.maxUnits) return undefined;
    const key = `${customer}\u0000${metric}`;
    const a = this.allowances.get(key);
    if (a) return a;
    let p = this.opening.get(key);
    if (!p) {
      p = this.open(key, customer, metric, units).finally(() => this.opening.delete(key));
      this.opening.set(key, p);
    }
    return p;
  }

  private async open(key: string, customer: string, metric: string, units: number): Promise<Allowance | undefined> {
    const snap = (await this.c.entitlementSnapshot({ path: { id: customer }, headers: { "Cache-Control": "no-cache" } })) as Snapshot;
    const se = snap.entitlements[metric] as Record<string, unknown> | undefined;
    if (!se || se.type !== "metered" || se.cost_type !== "per_unit" || typeof se.estimated_cost_per_unit !== "number" || !se.allowed) {
      return undefined;
    }
    const cust = (await this.c.getCustomer({ path: { id: snap.customer_id } })) as Schemas["Customer"];
    const policy = cust.overage_policy ?? ((await this.c.getTenant()) as Schemas["TenantConfig"]).default_overage_policy;
    const want = Math.min(Math.max(units, this.o.minUnits), this.o.maxUnits);
    let hold: Schemas["ReserveResult"];
    try {
      hold = (await this.c.createReservation({
        body: { customer_id: snap.customer_id, billable_metric_key: metric, estimated_units: want, ttl_seconds: this.o.holdTtlSeconds },
      })) as Schemas["ReserveResult"];
    } catch (err) {
      if (isProblem(err, "insufficient-credits")) {
        this.s.topUpsRefused++;
        return undefined; // the server answers this consume (and refuses it under block)
      }
      throw err;
    }
    const a: Allowance = {
      key,
      customer: snap.customer_id,
      metric,
      perUnit: se.estimated_cost_per_unit,
      policy,
      id: hold.id,
      held: se.estimated_cost_per_unit > 0 ? Math.floor(hold.estimated_cost / se.estimated_cost_per_unit) : want,
      used: 0,
      sending: 0,
      busy: false,
      target: want,
      demand: 0,
      rate: 0,
      idleTicks: 0,
      prolongedAt: Date.now(),
      refusedUntil: 0,
      waiters: [],
    };
    if (this.closed) {
      await this.c.releaseReservation({ path: { id: a.id } }).catch((err) => this.o.onError?.(err));
      return undefined;
    }
    this.allowances.set(key, a);
    this.s.allowances++;
    this.timer ??= setInterval(() => this.tick(), this.o.settleIntervalMs);
    return a;
  }

  private tick(): void {
    for (const a of this.allowances.values()) {
      if (a.busy) continue;
      // The target covers horizonMs of the smoothed rate.
      a.rate = a.rate === 0 ? a.demand : Math.round((a.rate * 3 + a.demand) / 4);
      const perHorizon = Math.ceil((a.rate * this.o.horizonMs) / this.o.settleIntervalMs);
      a.target = Math.min(Math.max(perHorizon, this.o.minUnits), this.o.maxUnits);
      a.idleTicks = a.demand === 0 ? a.idleTicks + 1 : 0;
      a.demand = 0;
      void this.settle(a);
    }
  }

  // settle sends what was used as a partial commit, then tops the hold up
  // or prolongs it; an allowance idle for half the hold's life is finished.
  private async settle(a: Allowance): Promise<void> {
    a.busy = true;
    try {
      const idleFor = a.idleTicks * this.o.settleIntervalMs;
      if (idleFor >= (this.o.holdTtlSeconds * 1000) / 2) {
        this.allowances.delete(a.key);
        await this.finish(a);
        return;
      }
      if (a.pendingSettle || a.used > 0) await this.partial(a);
      if (!this.allowances.has(a.key)) return;
      const left = a.held - a.used - a.sending;
      const prolong = Date.now() - a.prolongedAt >= (this.o.holdTtlSeconds * 1000) / 2;
      if (left < a.target / 2 || prolong) await this.extend(a, left < a.target / 2 ? a.target - left : 0, prolong);
    } catch (err) {
      this.o.onError?.(err);
    } finally {
      a.busy = false;
    }
  }

  private async partial(a: Allowance): Promise<void> {
    const send = a.pendingSettle ?? { key: newKey(), units: a.used };
    if (!a.pendingSettle) {
      a.used -= send.units;
      a.sending += send.units;
    }
    a.pendingSettle = send;
    try {
      const res = (await this.c.commitReservation({
        path: { id: a.id },
        body: { actual_units: send.units, final: false },
        idempotencyKey: send.key,
      })) as Schemas["CommitResult"];
      a.pendingSettle = undefined;
      a.sending -= send.units;
      this.s.settledUnits += send.units;
      this.s.settles++;
      this.fit(a, res.remaining_cost);
    } catch (err) {
      if (this.gone(err)) {
        // The hold is gone (expired, settled elsewhere): what it carried
        // can no longer be collected; the next consume opens a new one.
        a.pendingSettle = undefined;
        this.s.uncollectedUnits += send.units + a.used;
        a.sending = 0;
        a.used = 0;
        this.allowances.delete(a.key);
        return;
      }
      throw err; // sent again, same key and body, on the next tick
    }
  }

  private async extend(a: Allowance, more: number, prolong: boolean): Promise<void> {
    const body: { additional_units?: number; ttl_seconds?: number } = {};
    if (more > 0) body.additional_units = more;
    if (prolong || more > 0) body.ttl_seconds = this.o.holdTtlSeconds;
    try {
      const res = (await this.c.extendReservation({ path: { id: a.id }, body })) as Schemas["ExtendResult"];
      this.s.topUps++;
      a.prolongedAt = Date.now();
      a.refusedUntil = 0;
      this.fit(a, res.remaining_cost);
    } catch (err) {
      if (isProblem(err, "insufficient-credits")) {
        // Nothing more can be held: past what is held, consumes are refused
        // (block) or go to the server, for one interval.
        this.s.topUpsRefused++;
        a.refusedUntil = Date.now() + this.o.settleIntervalMs;
        this.wake(a);
        return;
      }
      if (this.gone(err)) {
        this.s.uncollectedUnits += a.used + a.sending;
        this.allowances.delete(a.key);
        return;
      }
      throw err;
    }
  }

  // topUp asks for more at once when a consume found too little left.
  private async topUp(a: Allowance, need: number): Promise<void> {
    if (a.busy) return;
    a.busy = true;
    try {
      const left = a.held - a.used - a.sending;
      a.target = Math.min(Math.max(a.target * 2, need, this.o.minUnits), this.o.maxUnits);
      await this.extend(a, Math.max(a.target - left, need), false);
    } catch (err) {
      this.o.onError?.(err);
    } finally {
      a.busy = false;
      this.wake(a);
    }
  }

  // fit sets what the hold covers from its remaining_cost: the units not
  // settled yet, those charged locally since included.
  private fit(a: Allowance, remainingCost: number | undefined): void {
    if (typeof remainingCost === "number" && a.perUnit > 0) a.held = Math.floor(remainingCost / a.perUnit);
    this.wake(a);
  }

  private wake(a: Allowance): void {
    const w = a.waiters.splice(0);
    for (const r of w) r();
  }

  private gone(err: unknown): boolean {
    return err instanceof CreditdProblem && (err.status === 404 || (err.status === 409 && !err.inProgress && err.type !== "insufficient-credits"));
  }

  // finish settles what is left with the final commit (or a release when
  // nothing was used since), returning the rest of the hold.
  private async finish(a: Allowance): Promise<void> {
    for (let i = 0; i < 50 && a.busy; i++) await new Promise((r) => setTimeout(r, 20));
    try {
      if (a.pendingSettle) await this.partial(a);
      const units = a.used;
      if (units > 0) {
        a.used = 0;
        a.sending += units;
        await this.c.commitReservation({ path: { id: a.id }, body: { actual_units: units } });
        a.sending -= units;
        this.s.settledUnits += units;
        this.s.settles++;
      } else {
        await this.c.releaseReservation({ path: { id: a.id } });
      }
    } catch (err) {
      if (!this.gone(err)) this.o.onError?.(err);
    } finally {
      this.allowances.delete(a.key);
    }
  }
}
