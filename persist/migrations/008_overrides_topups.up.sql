-- 008_overrides_topups: subscription overrides (interface.md Override) and
-- the index behind the topup list (addendum 7).
--
-- Overrides are written directly by the API, so like the catalogue they carry
-- foreign keys and checks. Rows are never removed: DELETE and the
-- replacement of an expired override set deleted_at (history kept).
-- subscription_id carries no foreign key so this migration does not depend
-- on the subscriptions migration; the service checks the subscription's
-- scope before every write.

CREATE TABLE subscription_overrides (
    id                  UUID PRIMARY KEY,
    tenant_id           UUID NOT NULL REFERENCES tenants (id),
    environment         TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    subscription_id     UUID NOT NULL,
    billable_metric_id  UUID NOT NULL,
    billable_metric_key TEXT NOT NULL,
    value               JSONB NOT NULL CHECK (jsonb_typeof(value) = 'object'),
    expires_at          TIMESTAMPTZ,
    reason              TEXT NOT NULL DEFAULT '',
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL,
    deleted_at          TIMESTAMPTZ,
    FOREIGN KEY (tenant_id, environment, billable_metric_key)
        REFERENCES billable_metrics (tenant_id, environment, key)
);

-- At most one undeleted override per subscription and metric: the backstop
-- behind "one live override per metric" (an expired one is marked deleted in
-- the transaction that creates its successor).
CREATE UNIQUE INDEX subscription_overrides_one_per_metric
    ON subscription_overrides (subscription_id, billable_metric_key) WHERE deleted_at IS NULL;

-- The topup list reads a customer's topup ledger entries newest first
-- without walking its consumption entries.
CREATE INDEX ledger_entries_topups_idx
    ON ledger_entries (customer_id, created_at DESC, id DESC) WHERE type = 'topup';
