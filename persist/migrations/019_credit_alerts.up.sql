-- 019_credit_alerts: balance thresholds and auto top-up rules (issue 15
-- item 4). credit_alert_settings holds one configuration per customer and
-- one tenant default per environment (customer_id NULL), written by the
-- API. credit_alert_states is the persister's memory between batches: the
-- effective balance after the last evaluated Mutation (a threshold is armed
-- while it is at or above it), the version that Mutation set (a replay is
-- skipped), the newest grant (the base of percent_of_last_grant) and when a
-- top-up was last requested (its dedupe window).

CREATE TABLE credit_alert_settings (
    tenant_id   UUID NOT NULL REFERENCES tenants (id),
    environment TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    customer_id UUID REFERENCES customers (id),
    settings    JSONB NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);

CREATE UNIQUE INDEX credit_alert_settings_default
    ON credit_alert_settings (tenant_id, environment) WHERE customer_id IS NULL;
CREATE UNIQUE INDEX credit_alert_settings_customer
    ON credit_alert_settings (customer_id) WHERE customer_id IS NOT NULL;

CREATE TABLE credit_alert_states (
    customer_id        UUID PRIMARY KEY,
    tenant_id          UUID NOT NULL,
    account_version    BIGINT NOT NULL,
    balance_mc         BIGINT NOT NULL,
    last_grant_mc      BIGINT NOT NULL,
    topup_requested_at TIMESTAMPTZ,
    updated_at         TIMESTAMPTZ NOT NULL
);
