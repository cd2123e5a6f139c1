-- 006_plans: the product catalogue (interface.md Plan, Plan variant, Plan
-- credit grant; addendum 5). Written directly by the API, so like the
-- directory and catalog tables they carry foreign keys and checks. Every row
-- belongs to one tenant and one environment, the scope of the API key that
-- wrote it.

CREATE TABLE plans (
    id          UUID PRIMARY KEY,
    tenant_id   UUID NOT NULL REFERENCES tenants (id),
    environment TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    name        TEXT NOT NULL CHECK (name <> ''),
    is_default  BOOLEAN NOT NULL DEFAULT false,
    status      TEXT NOT NULL CHECK (status IN ('active', 'retired')),
    metadata    JSONB NOT NULL DEFAULT '{}',
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    -- The default plan cannot be retired (409 in the API).
    CONSTRAINT plans_default_active CHECK (NOT (is_default AND status = 'retired'))
);

-- At most one default plan per tenant and environment: the backstop behind
-- the transaction that clears the previous default.
CREATE UNIQUE INDEX plans_one_default ON plans (tenant_id, environment) WHERE is_default;

-- Newest-first cursor paging of GET /v1/plans.
CREATE INDEX plans_newest_idx ON plans (tenant_id, environment, created_at DESC, id DESC);

CREATE TABLE plan_variants (
    id                        UUID PRIMARY KEY,
    plan_id                   UUID NOT NULL REFERENCES plans (id),
    tenant_id                 UUID NOT NULL,
    environment               TEXT NOT NULL,
    billing_cycle             TEXT NOT NULL
        CHECK (billing_cycle IN ('daily', 'weekly', 'monthly', 'yearly', 'one_time')),
    trial_days                INTEGER NOT NULL DEFAULT 0 CHECK (trial_days >= 0),
    status                    TEXT NOT NULL CHECK (status IN ('active', 'retired')),
    billing_mode              TEXT NOT NULL CHECK (billing_mode IN ('prepaid', 'postpaid')),
    renewal_due_days          INTEGER NOT NULL DEFAULT 3 CHECK (renewal_due_days >= 0),
    grace_period_days         INTEGER NOT NULL DEFAULT 3 CHECK (grace_period_days >= 0),
    allow_usage_while_overdue BOOLEAN NOT NULL DEFAULT true,
    metadata                  JSONB NOT NULL DEFAULT '{}',
    created_at                TIMESTAMPTZ NOT NULL,
    updated_at                TIMESTAMPTZ NOT NULL
);

-- Oldest-first variants of a plan (GET /v1/plans/{id}/variants, include_variants).
CREATE INDEX plan_variants_plan_idx ON plan_variants (plan_id, created_at, id);

CREATE TABLE plan_grants (
    id                    UUID PRIMARY KEY,
    plan_variant_id       UUID NOT NULL REFERENCES plan_variants (id),
    tenant_id             UUID NOT NULL,
    environment           TEXT NOT NULL,
    credits               BIGINT NOT NULL CHECK (credits > 0),
    -- A keyword or an ISO 8601 duration, as the tenant sent it.
    grant_interval        TEXT NOT NULL,
    expires_after_seconds BIGINT CHECK (expires_after_seconds > 0),
    accumulation_cap      BIGINT CHECK (accumulation_cap > 0),
    rollover_percentage   INTEGER NOT NULL DEFAULT 0 CHECK (rollover_percentage BETWEEN 0 AND 100),
    max_rollover_cycles   INTEGER CHECK (max_rollover_cycles >= 0),
    grant_type            TEXT NOT NULL CHECK (grant_type IN ('recurring', 'one_time', 'trial')),
    source                TEXT NOT NULL DEFAULT 'plan_grant',
    created_at            TIMESTAMPTZ NOT NULL,
    updated_at            TIMESTAMPTZ NOT NULL
);

CREATE INDEX plan_grants_variant_idx ON plan_grants (plan_variant_id, created_at, id);

CREATE TABLE variant_entitlements (
    id                  UUID PRIMARY KEY,
    plan_variant_id     UUID NOT NULL REFERENCES plan_variants (id),
    tenant_id           UUID NOT NULL,
    environment         TEXT NOT NULL,
    billable_metric_key TEXT NOT NULL,
    -- type copies the metric's (immutable) type; value is shaped by it.
    type                TEXT NOT NULL CHECK (type IN ('metered', 'boolean', 'gauge', 'static')),
    value               JSONB NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL,
    -- One entitlement per metric and variant: a second one replaces it.
    CONSTRAINT variant_entitlements_key UNIQUE (plan_variant_id, billable_metric_key),
    FOREIGN KEY (tenant_id, environment, billable_metric_key)
        REFERENCES billable_metrics (tenant_id, environment, key)
);

CREATE INDEX variant_entitlements_variant_idx ON variant_entitlements (plan_variant_id, created_at, id);
