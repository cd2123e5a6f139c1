// Verification of creditd's webhook signatures (Standard Webhooks):
// webhook-signature holds "v1,<base64 HMAC-SHA256>" of
// "{webhook-id}.{webhook-timestamp}.{body}", keyed by the base64-decoded
// part of the tenant's whsec_ secret.
import { createHmac, timingSafeEqual } from "node:crypto";

/** How far webhook-timestamp may be from the receiver's clock, either way (the Standard Webhooks default). */
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Why a delivery did not verify: "headers", "timestamp" or "signature". */
export class WebhookVerificationError extends Error {
  constructor(readonly reason: "headers" | "timestamp" | "signature", message: string) {
    super(`creditd: ${message}`);
    this.name = "WebhookVerificationError";
  }
}

/** The body of a webhook delivery. Dedupe on event_id (also webhook-id): delivery is at least once. */
export interface WebhookPayload {
  event_id: string;
  event_type: string;
  tenant_id: string;
  environment: "live" | "sandbox";
  /** Null for tenant-wide events (test.ping). */
  customer_id: string | null;
  external_customer_id: string | null;
  created_at: string;
  idempotency_key: string;
  /** The event's own members. */
  data: Record<string, unknown>;
}

/** Headers as node's http (IncomingHttpHeaders), fetch (Headers) or a plain object give them. */
export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

export interface VerifyOptions {
  /** Default DEFAULT_TOLERANCE_SECONDS. */
  toleranceSeconds?: number;
  /** The receiver's clock in unix seconds (default now). */
  nowSeconds?: number;
}

function header(h: WebhookHeaders, name: string): string {
  if (typeof (h as Headers).get === "function") return (h as Headers).get(name) ?? "";
  const rec = h as Record<string, string | string[] | undefined>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name);
  const v = key === undefined ? undefined : rec[key];
  return (Array.isArray(v) ? v[0] : v) ?? "";
}

function secretKey(secret: string): Buffer {
  const b64 = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64)) throw new TypeError("creditd: the webhook secret is not whsec_ and base64");
  return Buffer.from(b64, "base64");
}

function hmac(key: Buffer, id: string, ts: string, body: string | Uint8Array): Buffer {
  return createHmac("sha256", key).update(`${id}.${ts}.`).update(body).digest();
}

/** The webhook-signature value creditd sends for a delivery, for testing a receiver. */
export function signWebhook(secret: string, id: string, timestampSeconds: number, body: string | Uint8Array): string {
  return `v1,${hmac(secretKey(secret), id, String(timestampSeconds), body).toString("base64")}`;
}

/**
 * Checks a delivery's headers and raw body (exactly as received, before any
 * JSON parsing) against the signing secret; throws WebhookVerificationError.
 * Several space-separated signatures (a secret rotation) pass when one matches.
 */
export function verifyWebhook(secret: string, headers: WebhookHeaders, body: string | Uint8Array, options: VerifyOptions = {}): void {
  const key = secretKey(secret);
  const id = header(headers, "webhook-id");
  const ts = header(headers, "webhook-timestamp");
  const sigs = header(headers, "webhook-signature");
  if (!id || !ts || !sigs || !/^\d+$/.test(ts)) throw new WebhookVerificationError("headers", "webhook headers missing or malformed");
  const now = options.nowSeconds ?? Math.floor(Date.now() / 1000);
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (Math.abs(now - Number(ts)) > tolerance) throw new WebhookVerificationError("timestamp", "webhook timestamp outside the tolerance");
  const want = hmac(key, id, ts, body);
  for (const s of sigs.split(" ")) {
    const [version, sig] = s.split(",", 2);
    if (version !== "v1" || !sig) continue;
    const got = Buffer.from(sig, "base64");
    if (got.length === want.length && timingSafeEqual(got, want)) return;
  }
  throw new WebhookVerificationError("signature", "webhook signature does not match");
}

/** Verifies a delivery and parses its body. */
export function parseWebhook(secret: string, headers: WebhookHeaders, body: string | Uint8Array, options: VerifyOptions = {}): WebhookPayload {
  verifyWebhook(secret, headers, body, options);
  const text = typeof body === "string" ? body : Buffer.from(body).toString("utf8");
  return JSON.parse(text) as WebhookPayload;
}
