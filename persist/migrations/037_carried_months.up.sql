-- 037_carried_months (expand): each tenant's span of carried event
-- sequences per month of the ledger (issue 30 item 1; docs/decisions.md
-- "Event pages in one round trip"). A consume event carried by its ledger
-- entry (028, persist/carried.go) is dated by its consume and numbered
-- when the persister writes it, so a lagging persister stores old-dated
-- entries with new sequences, as for event rows (036): no created_at
-- bound follows from a sequence. ledger_event_months keeps, per tenant
-- and month of created_at (UTC), the lowest and highest event_sequence
-- stored there; the carried read bounds created_at by the months whose
-- span meets its sequences. A span only widens, so a row deleted later
-- leaves it too wide, never too narrow.
--
-- The lean write keeps the spans (persist/events.go eventCopy.queueBump),
-- in the transaction that numbers the entries, right after it takes the
-- tenants' counter rows, so a span row adds no wait a writer of the tenant
-- did not have. The previous release's nodes do not keep them, so readers
-- trust the spans only once this migration's contract is recorded (it
-- runs when none of those nodes does, and fills the spans from the stored
-- entries).
CREATE TABLE ledger_event_months (
    tenant_id UUID NOT NULL,
    month     TIMESTAMPTZ NOT NULL,
    low       BIGINT NOT NULL,
    high      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, month)
);
