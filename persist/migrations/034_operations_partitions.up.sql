-- 034_operations_partitions (expand): operations partitioned by month like
-- the ledger (issue 30 item 1; migration 033, docs/decisions.md "The
-- ledger by month").
--
-- operations keeps a keyed Mutation other than a lean consume. Its replay
-- fence is the unique key (tenant_id, idempotency_key, op_id); a
-- partitioned table's unique keys must include created_at, the Mutation's
-- instant, which a replay carries too. This step adds that key on the
-- table as it is, for this release's ON CONFLICT (tenant_id,
-- idempotency_key, op_id, created_at); the previous release's
-- ON CONFLICT (tenant_id, idempotency_key, op_id) keeps its index until
-- 034_operations_partitions.contract.sql switches the table. IF NOT EXISTS:
-- an operator may build it CONCURRENTLY by hand first.
CREATE UNIQUE INDEX IF NOT EXISTS operations_created_key
    ON operations (tenant_id, idempotency_key, op_id, created_at);
