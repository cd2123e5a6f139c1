// The fetch wrapper: one typed function per tenant operation of
// api/openapi.json, with creditd's retry and idempotency rules.
import type { components, operations as Ops } from "./schema.js";
import { operations as routes } from "./operations.js";

/** Every schema of the API by name: `Schemas["Customer"]`. */
export type Schemas = components["schemas"];

/** The operationId of a tenant operation. */
export type OperationId = keyof typeof routes;

type Op<K extends OperationId> = Ops[K];
type Params<K extends OperationId> = Op<K>["parameters"];

// Part is { [key]: V } when T has a key member that is not never, optional
// when T's member is.
type Part<T, Key extends string, As extends string = Key> = T extends { [k in Key]?: infer V }
  ? [V] extends [never | undefined]
    ? {}
    : {} extends Pick<T, Key & keyof T>
      ? { [k in As]?: Exclude<V, undefined> }
      : { [k in As]: V }
  : {};

type JSONBody<B> = B extends { content: { "application/json": infer J } } ? J : never;
type BodyPart<K extends OperationId> =
  Op<K> extends { requestBody: infer B }
    ? [JSONBody<B>] extends [never]
      ? {}
      : { body: JSONBody<B> }
    : Op<K> extends { requestBody?: infer B }
      ? [JSONBody<B>] extends [never]
        ? {}
        : { body?: JSONBody<B> }
      : {};

/** The path, query and body an operation takes. */
export type OperationArgs<K extends OperationId> = Part<Params<K>, "path"> & Part<Params<K>, "query"> & BodyPart<K>;

type JSONOf<R> = R extends { content: { "application/json": infer J } } ? J : undefined;

/**
 * What a successful call of the operation returns (undefined for a 204). A
 * 201 comes first: the one operation with both (createReservation) answers
 * 200 only to a dry run, whose shape the caller asked for knowingly.
 */
export type OperationResult<K extends OperationId> = Op<K>["responses"] extends infer R
  ? R extends { 201: infer S }
    ? JSONOf<S>
    : R extends { 200: infer S }
      ? JSONOf<S>
      : R extends { 202: infer S }
        ? JSONOf<S>
        : undefined
  : never;

/** Options of one call. */
export interface CallOptions {
  /** The Idempotency-Key to send instead of a generated UUID. */
  idempotencyKey?: string;
  /** More request headers (say Cache-Control: no-cache for a fresh snapshot). */
  headers?: Record<string, string>;
  /** Ends the call, its retries and its waits. */
  signal?: AbortSignal;
  /** Receives what the call saw of its last answer, also when it fails. */
  onResponse?: (info: ResponseInfo) => void;
}

/** What a call saw of its last HTTP answer. */
export interface ResponseInfo {
  /** The last status; 0 when no answer arrived. */
  status: number;
  headers?: Headers;
  /** True when creditd answered from its idempotency record: the operation had already applied. */
  replayed: boolean;
  /** How many times the call was sent. */
  attempts: number;
  /** The key the call sent ("" when none): give it back as idempotencyKey to retry the operation later. */
  idempotencyKey: string;
}

type ArgsTuple<K extends OperationId> = {} extends OperationArgs<K>
  ? [args?: OperationArgs<K> & CallOptions]
  : [args: OperationArgs<K> & CallOptions];

/** One function per tenant operation, named by its operationId. */
export type Operations = { [K in OperationId]: (...args: ArgsTuple<K>) => Promise<OperationResult<K>> };

/** Settings of a client. */
export interface ClientOptions {
  /** creditd's base URL, with or without a trailing slash. */
  baseUrl: string;
  /** The tenant API key, sent as X-API-Key; it decides the environment. */
  apiKey: string;
  /** How many times a call is sent at most, the first included (default 4). */
  maxAttempts?: number;
  /** First back-off wait when the server named no Retry-After, doubled per attempt (default 200 ms). */
  baseDelayMs?: number;
  /** Longest wait between attempts; a longer Retry-After ends the call with the problem (default 30 s). */
  maxDelayMs?: number;
  /** Bound of each attempt (default 30 s). */
  timeoutMs?: number;
  /** Makes the keys of calls that give none (default crypto.randomUUID). */
  newIdempotencyKey?: () => string;
  /** The fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
}

/** The operations that page: a cursor query parameter and a {data, pagination} answer. */
export type PagedOperationId = {
  [K in OperationId]: OperationResult<K> extends { data: unknown[]; pagination: unknown }
    ? Params<K> extends { query?: { cursor?: string } }
      ? K
      : never
    : never;
}[OperationId];

/** The item type of a paged operation. */
export type PageItem<K extends OperationId> = OperationResult<K> extends { data: (infer T)[] } ? T : never;

/** A client: one function per operation, `call` to name the operation by string, `paginate` to walk pages. */
export type CreditdClient = Operations & {
  call<K extends OperationId>(op: K, ...args: ArgsTuple<K>): Promise<OperationResult<K>>;
  /** Every item a paged operation answers, page after page from query.cursor (the first page when unset). */
  paginate<K extends PagedOperationId>(op: K, ...args: ArgsTuple<K>): AsyncGenerator<PageItem<K>, void, undefined>;
};

/** Problem types creditd answers. */
export type ProblemType =
  | "bad-request"
  | "unauthorized"
  | "not-found"
  | "conflict"
  | "insufficient-credits"
  | "reservation-expired"
  | "validation-error"
  | "rate-limited"
  | "unavailable"
  | "internal";

/**
 * An error creditd answered, from its RFC 9457 body. A body that is not a
 * problem (a proxy's page) gives an empty type, the status and the start of
 * the body as detail.
 */
export class CreditdProblem extends Error {
  readonly type: ProblemType | "";
  readonly title: string;
  readonly status: number;
  readonly detail: string;
  /** The input member, query parameter or header at fault. */
  readonly field?: string;
  readonly errors?: { field: string; message: string }[];
  /** Also the X-Request-Id header: quote it when reporting. */
  readonly requestId: string;
  /** The gauge 409's count, cap and shortfall. */
  readonly current?: number;
  readonly cap?: number;
  readonly shortfall?: number;
  /** The answer's Retry-After in milliseconds (0 when none). */
  readonly retryAfterMs: number;

  constructor(status: number, body: Record<string, unknown>, requestId: string, retryAfterMs: number) {
    const type = typeof body.type === "string" ? (body.type as ProblemType) : "";
    const detail = typeof body.detail === "string" ? body.detail : "";
    super(`creditd: ${status} ${type || body.title || ""}${body.field ? ` (${body.field})` : ""}${detail ? `: ${detail}` : ""}`);
    this.name = "CreditdProblem";
    this.type = type;
    this.title = typeof body.title === "string" ? body.title : "";
    this.status = status;
    this.detail = detail;
    if (typeof body.field === "string") this.field = body.field;
    if (Array.isArray(body.errors)) this.errors = body.errors as { field: string; message: string }[];
    this.requestId = typeof body.request_id === "string" && body.request_id ? body.request_id : requestId;
    if (typeof body.current === "number") this.current = body.current;
    if (typeof body.cap === "number") this.cap = body.cap;
    if (typeof body.shortfall === "number") this.shortfall = body.shortfall;
    this.retryAfterMs = retryAfterMs;
  }

  /** The 409 of a request whose Idempotency-Key a twin request still holds: safe to send again with the key. */
  get inProgress(): boolean {
    return this.status === 409 && this.type === "conflict" && this.detail.includes("still in progress");
  }
}

/** Reports whether err is a CreditdProblem, of type `type` when given. */
export function isProblem(err: unknown, type?: ProblemType): err is CreditdProblem {
  return err instanceof CreditdProblem && (type === undefined || err.type === type);
}

const maxProblemChars = 1 << 20;

/** Reads a Retry-After of delay-seconds or an HTTP-date, in milliseconds. */
export function retryAfterMs(value: string | null, now = Date.now()): number {
  if (!value) return 0;
  const v = value.trim();
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = Date.parse(v);
  return Number.isNaN(at) || at <= now ? 0 : at - now;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Decodes a non-2xx answer. */
async function readProblem(res: Response): Promise<CreditdProblem> {
  const text = (await res.text()).slice(0, maxProblemChars);
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(text);
    if (typeof body !== "object" || body === null || typeof body.type !== "string") throw new Error("not a problem");
  } catch {
    body = { title: res.statusText, detail: text.trim().slice(0, 200) };
  }
  return new CreditdProblem(res.status, body, res.headers.get("X-Request-Id") ?? "", retryAfterMs(res.headers.get("Retry-After")));
}

/** Builds a client. See the package README for the retry and idempotency rules. */
export function createClient(options: ClientOptions): CreditdClient {
  const base = options.baseUrl.replace(/\/+$/, "");
  const maxAttempts = options.maxAttempts && options.maxAttempts > 0 ? options.maxAttempts : 4;
  const baseDelay = options.baseDelayMs && options.baseDelayMs > 0 ? options.baseDelayMs : 200;
  const maxDelay = options.maxDelayMs && options.maxDelayMs > 0 ? options.maxDelayMs : 30_000;
  const timeout = options.timeoutMs && options.timeoutMs > 0 ? options.timeoutMs : 30_000;
  const newKey = options.newIdempotencyKey ?? (() => globalThis.crypto.randomUUID());
  const doFetch = options.fetch ?? globalThis.fetch;

  const backoff = (attempt: number) => {
    const d = Math.min(baseDelay * 2 ** (attempt - 1), maxDelay);
    return d / 2 + Math.random() * (d / 2);
  };

  async function call<K extends OperationId>(op: K, ...rest: ArgsTuple<K>): Promise<OperationResult<K>> {
    const route = routes[op];
    if (!route) throw new TypeError(`creditd: unknown operation ${String(op)}`);
    const args = (rest[0] ?? {}) as {
      path?: Record<string, string>;
      query?: Record<string, unknown>;
      body?: unknown;
    } & CallOptions;
    let path: string = route.path.replace(/\{([^}]+)\}/g, (_, name: string) => {
      const v = args.path?.[name];
      if (v === undefined) throw new TypeError(`creditd: ${String(op)} needs path parameter ${name}`);
      return encodeURIComponent(String(v));
    });
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(args.query ?? {})) {
      if (v === undefined || v === null) continue;
      q.append(k, v instanceof Date ? v.toISOString() : String(v));
    }
    if ([...q.keys()].length > 0) path += `?${q}`;
    const key = route.idempotent ? args.idempotencyKey || newKey() : "";
    const headers: Record<string, string> = {
      "X-API-Key": options.apiKey,
      Accept: "application/json",
      ...args.headers,
    };
    let payload: string | undefined;
    if (args.body !== undefined) {
      payload = JSON.stringify(args.body);
      headers["Content-Type"] = "application/json";
    }
    if (key) headers["Idempotency-Key"] = key;
    // A network error leaves unknown whether the request applied: only a
    // request that cannot apply twice is sent again.
    const repeatable = route.method === "GET" || key !== "";
    const info: ResponseInfo = { status: 0, replayed: false, attempts: 0, idempotencyKey: key };
    try {
      for (let attempt = 1; ; attempt++) {
        info.attempts = attempt;
        let last: unknown;
        let wait = 0;
        let retry = false;
        let ok: Response | undefined;
        try {
          const signals = [AbortSignal.timeout(timeout), ...(args.signal ? [args.signal] : [])];
          const res = await doFetch(base + path, {
            method: route.method,
            headers,
            body: payload,
            signal: AbortSignal.any(signals),
          });
          info.status = res.status;
          info.headers = res.headers;
          info.replayed = res.headers.get("X-Idempotent-Replayed") === "true";
          if (res.ok) {
            ok = res;
          } else {
            last = await readProblem(res);
            const p = last as CreditdProblem;
            if (p.status === 429 || p.status === 503) {
              retry = p.retryAfterMs <= maxDelay;
              wait = p.retryAfterMs > 0 ? p.retryAfterMs : backoff(attempt);
            } else if (p.inProgress) {
              retry = true;
              wait = backoff(attempt);
            }
          }
        } catch (err) {
          if (args.signal?.aborted) throw err;
          last = err;
          retry = repeatable;
          wait = backoff(attempt);
        }
        if (ok) {
          // A 2xx is final: a body that does not decode is an error, never a retry.
          if (ok.status === 204) return undefined as OperationResult<K>;
          return (await ok.json()) as OperationResult<K>;
        }
        if (!retry || attempt >= maxAttempts) throw last;
        await sleep(wait, args.signal);
      }
    } finally {
      args.onResponse?.({ ...info });
    }
  }

  async function* paginate(op: OperationId, ...rest: unknown[]): AsyncGenerator<unknown, void, undefined> {
    const args = { ...((rest[0] ?? {}) as { query?: Record<string, unknown> }) };
    let query = { ...(args.query ?? {}) };
    for (;;) {
      const page = (await (call as (op: OperationId, ...a: unknown[]) => Promise<unknown>)(op, { ...args, query })) as {
        data: unknown[];
        pagination: { has_more: boolean; next_cursor: string | null };
      };
      yield* page.data;
      if (!page.pagination.has_more || !page.pagination.next_cursor) return;
      query = { ...query, cursor: page.pagination.next_cursor };
    }
  }

  const client = { call, paginate } as unknown as CreditdClient;
  for (const op of Object.keys(routes) as OperationId[]) {
    (client as Record<string, unknown>)[op] = (...rest: unknown[]) => (call as (op: OperationId, ...a: unknown[]) => unknown)(op, ...rest);
  }
  return client;
}
