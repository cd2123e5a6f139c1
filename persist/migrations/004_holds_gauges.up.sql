-- 004_holds_gauges: reservations (holds) and gauge counters. Like the other
-- credit tables they are written only by the persister from outbox
-- Mutations, so they carry no foreign keys or enum checks (see 001_init).
-- Each row keeps the account version of its last change and moves only
-- forward in it (invariant 5).

CREATE TABLE reservations (
    id                  UUID PRIMARY KEY,
    tenant_id           UUID NOT NULL,
    customer_id         UUID NOT NULL,
    environment         TEXT NOT NULL,
    billable_metric_key TEXT NOT NULL,
    estimated_units     BIGINT NOT NULL,
    estimated_cost      BIGINT NOT NULL,
    actual_units        BIGINT,
    actual_cost         BIGINT,
    -- released is the millicredits the hold gave back when it ended.
    released            BIGINT NOT NULL DEFAULT 0,
    status              TEXT NOT NULL,
    -- reference_id is the id itself: the reservation, commit and release
    -- ledger entries carry it.
    reference_id        UUID NOT NULL,
    expires_at          TIMESTAMPTZ NOT NULL,
    metadata            JSONB NOT NULL DEFAULT '{}',
    created_at          TIMESTAMPTZ NOT NULL,
    committed_at        TIMESTAMPTZ,
    released_at         TIMESTAMPTZ,
    version             BIGINT NOT NULL
);

-- Newest-first paging of a customer's reservations, all or by status.
CREATE INDEX reservations_customer_idx ON reservations (customer_id, created_at DESC, id DESC);
CREATE INDEX reservations_customer_status_idx
    ON reservations (customer_id, status, created_at DESC, id DESC);

-- A rebuild loads the active holds and those finalized recently: the
-- finalization instant, infinity while active.
CREATE INDEX reservations_rebuild_idx
    ON reservations (customer_id, (COALESCE(committed_at, released_at, 'infinity'::timestamptz)));

CREATE TABLE gauges (
    customer_id UUID NOT NULL,
    metric_key  TEXT NOT NULL,
    tenant_id   UUID NOT NULL,
    environment TEXT NOT NULL,
    current     BIGINT NOT NULL,
    version     BIGINT NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (customer_id, metric_key)
);
