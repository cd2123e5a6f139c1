-- 014_lean_keys: fewer index insertions per consume (issue 10 profile).
--
-- operations had three indexes: the op_id primary key (the replay fence),
-- (tenant_id, idempotency_key) for the usage and duplicate_replay look-ups,
-- and (customer_id, created_at) for the rebuild. One unique index on
-- (tenant_id, idempotency_key, op_id) serves both the look-up (its prefix)
-- and the replay fence (an op id always comes with the same tenant and key).
ALTER TABLE operations DROP CONSTRAINT operations_pkey;
DROP INDEX operations_tenant_key_idx;
CREATE UNIQUE INDEX operations_tenant_key_op_key ON operations (tenant_id, idempotency_key, op_id);

-- ledger_entries_consumption_idx duplicated the history index's
-- (customer_id, created_at) prefix for the one query that sums a period's
-- consumption; that query reads the history index and filters on type.
DROP INDEX ledger_entries_consumption_idx;

-- webhook_events_due_idx (status, next_retry_at) answered only the claim's
-- "which tenants have due events" scan, which the partial per-tenant due
-- index (pending and failed rows only) answers as well; every consume's
-- credit.consumed event paid for it.
DROP INDEX webhook_events_due_idx;
