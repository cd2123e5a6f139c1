-- 007_subscriptions: customers on plan variants (addendum 6) and the
-- scheduler's bookkeeping. Written directly by the API and the scheduler, so
-- like the catalogue tables they carry foreign keys and checks.

CREATE TABLE subscriptions (
    id                   UUID PRIMARY KEY,
    tenant_id            UUID NOT NULL REFERENCES tenants (id),
    environment          TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    customer_id          UUID NOT NULL REFERENCES customers (id),
    plan_id              UUID NOT NULL REFERENCES plans (id),
    plan_variant_id      UUID NOT NULL REFERENCES plan_variants (id),
    status               TEXT NOT NULL
        CHECK (status IN ('trialing', 'active', 'past_due', 'paused', 'canceled', 'expired')),
    billing_mode         TEXT NOT NULL CHECK (billing_mode IN ('prepaid', 'postpaid')),
    current_period_start TIMESTAMPTZ NOT NULL,
    current_period_end   TIMESTAMPTZ,
    trial_ends_at        TIMESTAMPTZ,
    renewal_due_at       TIMESTAMPTZ,
    grace_ends_at        TIMESTAMPTZ,
    cancel_at_period_end BOOLEAN NOT NULL DEFAULT false,
    canceled_at          TIMESTAMPTZ,
    metadata             JSONB NOT NULL DEFAULT '{}',
    created_at           TIMESTAMPTZ NOT NULL,
    updated_at           TIMESTAMPTZ NOT NULL,
    -- Scheduler bookkeeping (engine.SubscriptionRecord): when the
    -- subscription first became active, whether subscription.renewal_due
    -- went out for the current period, the per-grant state (last and next
    -- firing, rollover cycle count, block ids of the current cycle) and the
    -- soonest instant the scheduler has work for it (NULL: none).
    activated_at         TIMESTAMPTZ,
    renewal_warned       BOOLEAN NOT NULL DEFAULT false,
    grant_state          JSONB NOT NULL DEFAULT '[]',
    next_action_at       TIMESTAMPTZ
);

-- At most one live subscription per customer (addendum 6): the backstop
-- behind the 409 of a second create.
CREATE UNIQUE INDEX subscriptions_one_live ON subscriptions (customer_id)
    WHERE status IN ('trialing', 'active', 'past_due', 'paused');

-- Newest-first paging of GET /v1/customers/{id}/subscriptions.
CREATE INDEX subscriptions_customer_idx ON subscriptions (customer_id, created_at DESC, id DESC);

-- The scheduler's due queue.
CREATE INDEX subscriptions_due_idx ON subscriptions (next_action_at) WHERE next_action_at IS NOT NULL;

-- Consumption per metric of a customer over a period (postpaid usage).
CREATE INDEX ledger_entries_consumption_idx ON ledger_entries (customer_id, created_at)
    WHERE type = 'consumption';
