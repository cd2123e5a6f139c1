-- 003_catalog: billable metrics and their metering rules (addendum 4,
-- interface.md Metering rules). Both are written directly by the API, so
-- like the directory tables they carry foreign keys and checks.

CREATE TABLE billable_metrics (
    id            UUID PRIMARY KEY,
    tenant_id     UUID NOT NULL REFERENCES tenants (id),
    environment   TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    key           TEXT NOT NULL,
    name          TEXT NOT NULL,
    type          TEXT NOT NULL CHECK (type IN ('metered', 'boolean', 'gauge', 'static')),
    -- default_value is NULL for metered metrics (addendum 4).
    default_value JSONB,
    metadata      JSONB NOT NULL DEFAULT '{}',
    created_at    TIMESTAMPTZ NOT NULL,
    updated_at    TIMESTAMPTZ NOT NULL,
    -- A key is unique per tenant and environment (409 on a second one).
    CONSTRAINT billable_metrics_key UNIQUE (tenant_id, environment, key)
);

-- Oldest-first cursor paging of GET /v1/billable-metrics.
CREATE INDEX billable_metrics_oldest_idx ON billable_metrics (tenant_id, environment, created_at, id);

CREATE TABLE metering_rules (
    id                  UUID PRIMARY KEY,
    tenant_id           UUID NOT NULL,
    environment         TEXT NOT NULL,
    billable_metric_key TEXT NOT NULL,
    cost_type           TEXT NOT NULL CHECK (cost_type IN ('flat', 'per_unit', 'tiered')),
    base_cost           BIGINT NOT NULL DEFAULT 0 CHECK (base_cost >= 0),
    unit_cost           BIGINT NOT NULL DEFAULT 0 CHECK (unit_cost >= 0),
    -- tier_config is {mode, tiers: [{up_to, unit_cost, flat_cost}]}, NULL unless tiered.
    tier_config         JSONB,
    effective_from      TIMESTAMPTZ NOT NULL,
    -- effective_until is NULL while the rule is the active one of its metric.
    effective_until     TIMESTAMPTZ,
    metadata            JSONB NOT NULL DEFAULT '{}',
    created_at          TIMESTAMPTZ NOT NULL,
    updated_at          TIMESTAMPTZ NOT NULL,
    -- A rule prices a metric of its own tenant and environment; creating a
    -- rule creates a missing metric in the same transaction.
    FOREIGN KEY (tenant_id, environment, billable_metric_key)
        REFERENCES billable_metrics (tenant_id, environment, key)
);

-- One active rule per metric: the backstop behind CreateRule's row lock.
CREATE UNIQUE INDEX metering_rules_active_key
    ON metering_rules (tenant_id, environment, billable_metric_key) WHERE effective_until IS NULL;

-- Oldest-first cursor paging of GET /v1/metering-rules, all metrics or one.
CREATE INDEX metering_rules_oldest_idx ON metering_rules (tenant_id, environment, created_at, id);
CREATE INDEX metering_rules_metric_idx
    ON metering_rules (tenant_id, environment, billable_metric_key, created_at, id);
