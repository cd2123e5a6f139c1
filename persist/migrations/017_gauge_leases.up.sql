-- 017_gauge_leases: leases on gauge slots (issue 15). Written only by the
-- persister from the gauge section of outbox Mutations, in the same
-- transaction as the gauge counter, so a rebuild restores a gauge and its
-- active leases together. A row keeps the account version of its last
-- change and moves only forward in it (invariant 5).
CREATE TABLE gauge_leases (
    id                  UUID PRIMARY KEY,
    tenant_id           UUID NOT NULL,
    customer_id         UUID NOT NULL,
    environment         TEXT NOT NULL,
    billable_metric_key TEXT NOT NULL,
    -- amount is the slots the lease holds (the increment's amount).
    amount              BIGINT NOT NULL,
    -- status: active, released or expired.
    status              TEXT NOT NULL,
    expires_at          TIMESTAMPTZ NOT NULL,
    -- seconds is the length the lease was last taken or renewed for.
    seconds             BIGINT NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    -- ended_at: when it was released, or its expires_at once it lapsed.
    ended_at            TIMESTAMPTZ,
    version             BIGINT NOT NULL
);

-- The lease sweep lists the active leases past their expires_at; a
-- rebuild loads a customer's active leases.
CREATE INDEX gauge_leases_due_idx ON gauge_leases (expires_at) WHERE status = 'active';
CREATE INDEX gauge_leases_customer_idx ON gauge_leases (customer_id) WHERE status = 'active';
