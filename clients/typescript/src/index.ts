// @creditd/client: the typed TypeScript client of the creditd tenant API.
export {
  createClient,
  CreditdProblem,
  isProblem,
  retryAfterMs,
  type CallOptions,
  type ClientOptions,
  type CreditdClient,
  type OperationArgs,
  type OperationId,
  type OperationResult,
  type Operations,
  type PagedOperationId,
  type PageItem,
  type ProblemType,
  type ResponseInfo,
  type Schemas,
} from "./client.js";
export {
  DEFAULT_TOLERANCE_SECONDS,
  parseWebhook,
  signWebhook,
  verifyWebhook,
  WebhookVerificationError,
  type VerifyOptions,
  type WebhookHeaders,
  type WebhookPayload,
} from "./webhook.js";
export type { components, operations, paths } from "./schema.js";
export {
  Evaluator,
  local,
  streamChanges,
  type Answer,
  type ChangeEvent,
  type ChangeStreamOptions,
  type EvaluatorOptions,
  type Fallback,
} from "./edge.js";
export { Escrow, EscrowClosedError, type Charge, type EscrowOptions, type EscrowStats } from "./escrow.js";
