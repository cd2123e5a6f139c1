-- 001_init: the system of record. Money is BIGINT millicredits, instants are
-- TIMESTAMPTZ, ids are UUID.
--
-- The directory tables (tenants, api_keys, customers) are written directly by
-- the API and carry foreign keys and checks. The credit tables (credit_accounts,
-- credit_blocks, ledger_entries, operations) are written only by the
-- persister from outbox Mutations that Redis already acknowledged: they carry
-- no foreign keys or enum checks on purpose, because a row the persister
-- cannot insert would stall its outbox partition forever while the money
-- movement it records has already happened.

CREATE TABLE tenants (
    id                               UUID PRIMARY KEY,
    name                             TEXT NOT NULL,
    default_overage_policy           TEXT NOT NULL DEFAULT 'block'
        CHECK (default_overage_policy IN ('block', 'allow', 'notify')),
    default_low_balance_threshold_mc BIGINT NOT NULL DEFAULT 0
        CHECK (default_low_balance_threshold_mc >= 0),
    webhook_url                      TEXT,
    webhook_secret                   TEXT,
    rate_limit_per_second            INTEGER NOT NULL DEFAULT 1000 CHECK (rate_limit_per_second > 0),
    rate_limit_burst                 INTEGER NOT NULL DEFAULT 2000 CHECK (rate_limit_burst > 0),
    created_at                       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at                       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_keys (
    id          UUID PRIMARY KEY,
    tenant_id   UUID NOT NULL REFERENCES tenants (id),
    environment TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    -- key_hash is the SHA-256 of the plain key (addendum 1): the key itself is never stored.
    key_hash    BYTEA NOT NULL UNIQUE,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at  TIMESTAMPTZ
);

CREATE INDEX api_keys_tenant_idx ON api_keys (tenant_id);

CREATE TABLE customers (
    id                       UUID PRIMARY KEY,
    tenant_id                UUID NOT NULL REFERENCES tenants (id),
    environment              TEXT NOT NULL CHECK (environment IN ('live', 'sandbox')),
    external_id              TEXT NOT NULL,
    display_name             TEXT,
    overage_policy           TEXT CHECK (overage_policy IN ('block', 'allow', 'notify')),
    low_balance_threshold_mc BIGINT CHECK (low_balance_threshold_mc >= 0),
    metadata                 JSONB NOT NULL DEFAULT '{}',
    created_at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at               TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at               TIMESTAMPTZ
);

-- external_id is unique per tenant and environment among live rows only, so
-- a customer re-created after a soft delete is a new record (interface.md
-- Customers, addendum 12).
CREATE UNIQUE INDEX customers_external_id_key
    ON customers (tenant_id, environment, external_id) WHERE deleted_at IS NULL;

-- Newest-first cursor paging of GET /v1/customers.
CREATE INDEX customers_newest_idx
    ON customers (tenant_id, environment, created_at DESC, id DESC) WHERE deleted_at IS NULL;

CREATE TABLE credit_accounts (
    customer_id      UUID PRIMARY KEY,
    -- id is NULL while Redis has not named the account (it names it on the first grant).
    id               UUID,
    tenant_id        UUID NOT NULL,
    environment      TEXT NOT NULL,
    balance          BIGINT NOT NULL DEFAULT 0,
    reserved_balance BIGINT NOT NULL DEFAULT 0,
    pending_balance  BIGINT NOT NULL DEFAULT 0,
    lifetime_earned  BIGINT NOT NULL DEFAULT 0,
    -- version only grows; the persister moves the row only to a higher one (invariant 5).
    version          BIGINT NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL
);

CREATE TABLE credit_blocks (
    id               UUID PRIMARY KEY,
    tenant_id        UUID NOT NULL,
    customer_id      UUID NOT NULL,
    original_amount  BIGINT NOT NULL,
    remaining_amount BIGINT NOT NULL,
    priority         INTEGER NOT NULL,
    source           TEXT NOT NULL,
    starts_at        TIMESTAMPTZ NOT NULL,
    expires_at       TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL,
    metadata         JSONB NOT NULL DEFAULT '{}',
    -- version is the account version of the block's last change.
    version          BIGINT NOT NULL
);

-- A rebuild loads only blocks with credit left.
CREATE INDEX credit_blocks_live_idx ON credit_blocks (customer_id) WHERE remaining_amount > 0;

CREATE TABLE ledger_entries (
    -- id is engine.EntryID(op_id, index), so a replayed Mutation inserts nothing twice.
    id                  UUID PRIMARY KEY,
    op_id               UUID NOT NULL,
    tenant_id           UUID NOT NULL,
    customer_id         UUID NOT NULL,
    environment         TEXT NOT NULL,
    delta               BIGINT NOT NULL,
    type                TEXT NOT NULL,
    source              TEXT,
    credit_block_id     UUID,
    billable_metric_key TEXT,
    cost_units          BIGINT,
    exchange_rate       BIGINT,
    overage_mc          BIGINT NOT NULL DEFAULT 0,
    idempotency_key     TEXT NOT NULL DEFAULT '',
    reference_id        UUID,
    reason              TEXT,
    metadata            JSONB NOT NULL DEFAULT '{}',
    created_at          TIMESTAMPTZ NOT NULL
);

-- Newest-first history paging with the (created_at, id) cursor.
CREATE INDEX ledger_entries_history_idx ON ledger_entries (customer_id, created_at DESC, id DESC);

-- Overage sums read only the few entries that carry overage.
CREATE INDEX ledger_entries_overage_idx
    ON ledger_entries (customer_id, created_at) INCLUDE (billable_metric_key, overage_mc)
    WHERE overage_mc > 0;

-- operations remembers every Mutation that had an idempotency key, so a
-- rebuilt Redis still knows the keys it applied (invariant 4).
CREATE TABLE operations (
    op_id           UUID PRIMARY KEY,
    tenant_id       UUID NOT NULL,
    customer_id     UUID NOT NULL,
    idempotency_key TEXT NOT NULL,
    request_hash    TEXT NOT NULL DEFAULT '',
    -- account_version orders a customer's operations as Redis applied them.
    account_version BIGINT NOT NULL,
    mutation        JSONB NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL
);

CREATE INDEX operations_customer_idx ON operations (customer_id, created_at);
