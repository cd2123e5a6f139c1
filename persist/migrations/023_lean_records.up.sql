-- 023_lean_records: Postgres writes only what the record needs (issue 26
-- item 4; docs/decisions.md, "Lean records").
--
-- A consume no longer stores its whole Mutation in operations (some 1.4 kB
-- a row with its index). Its ledger entry, which holds the op, the tenant,
-- the customer, the key, the metric, the units, the charge, the overage and
-- the instant already, carries the few figures a replayed answer needs
-- besides (op_head: persist/ophead.go), and AppliedOps finds it by the
-- hash of (tenant, key) through a partial index that holds those rows only.
--
-- Expand only: the column is nullable and the index partial, so the
-- previous release's INSERTs (explicit column lists) still work and its
-- rows (an operations row per keyed op, op_head NULL) stay readable; the
-- new code reads both. Until every node runs this release, run the new
-- nodes with CREDITD_FULL_RECORDS=1 (docs/operations.md): an old
-- node looks keys up in operations only, so it must not meet a lean row.
ALTER TABLE ledger_entries ADD COLUMN op_head TEXT;

CREATE INDEX ledger_entries_op_key_idx
    ON ledger_entries (hashtextextended(tenant_id::text || idempotency_key, 0))
    WHERE op_head IS NOT NULL;
