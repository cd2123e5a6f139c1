-- 005_webhooks: the durable event record and its delivery attempts
-- (interface.md Webhook event). Events born in a Lua script are inserted by
-- the persister in the same transaction as their ledger entries, keyed by a
-- name-based id (engine.EventID), so a replay inserts nothing twice. Like the
-- credit tables they carry no foreign keys: a row the persister cannot insert
-- would stall its outbox partition.
CREATE TABLE webhook_events (
    id            UUID PRIMARY KEY,
    tenant_id     UUID NOT NULL,
    environment   TEXT NOT NULL,
    customer_id   UUID,
    event_type    TEXT NOT NULL,
    -- payload is the exact JSON body delivered.
    payload       JSONB NOT NULL,
    status        TEXT NOT NULL DEFAULT 'pending',
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_retry_at TIMESTAMPTZ,
    last_error    TEXT,
    created_at    TIMESTAMPTZ NOT NULL,
    delivered_at  TIMESTAMPTZ,
    -- locked_until/lease: a worker's claim on the event; once locked_until
    -- passes (the worker died) another worker may claim it again.
    locked_until  TIMESTAMPTZ,
    lease         UUID
);

-- The due queue: pending and failed events by next attempt.
CREATE INDEX webhook_events_due_idx ON webhook_events (status, next_retry_at);
-- Per-tenant claiming (fairness) over the due events only.
CREATE INDEX webhook_events_due_tenant_idx ON webhook_events (tenant_id, next_retry_at)
    WHERE status IN ('pending', 'failed');
-- Newest-first listing with the (created_at, id) cursor.
CREATE INDEX webhook_events_list_idx ON webhook_events (tenant_id, created_at DESC, id DESC);

CREATE TABLE webhook_deliveries (
    id            UUID PRIMARY KEY,
    event_id      UUID NOT NULL,
    status_code   INTEGER,
    response_body TEXT NOT NULL DEFAULT '',
    error         TEXT,
    duration_ms   BIGINT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL
);

CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id, created_at, id);
