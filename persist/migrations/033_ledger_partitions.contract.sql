-- 033_ledger_partitions (contract): the switch to a ledger partitioned by
-- month (issue 30 item 1). Run once no node of a release before 033 runs:
-- their ON CONFLICT (id, tenant_id) needs the key dropped here
-- (docs/operations.md "Contract steps").
--
-- No row is copied. The table as it is becomes the partition of every
-- instant before the cut (the first month after both now and its newest
-- row; this month when the ledger is empty) under the name
-- ledger_entries_legacy; a partitioned ledger_entries
-- takes its place with the same columns and indexes (Postgres attaches the
-- legacy table's equal indexes instead of building them); the months from
-- the cut on, three of them, get partitions of their own, and a DEFAULT
-- partition takes any row no month holds (an alarm: persist/partitions.go).
-- The only work proportional to the ledger is the scan that proves every
-- row lies before the cut (VALIDATE, then ATTACH trusts the CHECK); the
-- persister waits for this transaction meanwhile (TestLedgerSwitchOnline).
DO $$
DECLARE
    newest TIMESTAMPTZ;
    cut TIMESTAMPTZ;
BEGIN
    SELECT max(created_at) INTO newest FROM ledger_entries;
    IF newest IS NULL THEN
        -- An empty ledger (a fresh database): the legacy partition is
        -- empty and holds only instants before this month, which has a
        -- partition of its own like the months after it.
        cut := date_trunc('month', now(), 'UTC');
    ELSE
        cut := ((date_trunc('month', GREATEST(now(), newest), 'UTC') AT TIME ZONE 'UTC')
            + INTERVAL '1 month') AT TIME ZONE 'UTC';
    END IF;
    EXECUTE format('ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_legacy_range
        CHECK (created_at < %L) NOT VALID', cut);
    ALTER TABLE ledger_entries VALIDATE CONSTRAINT ledger_entries_legacy_range;

    -- The legacy table's keys: the partitioned parent's primary key is
    -- (id, tenant_id, created_at), the expand's index; the unique event
    -- sequence index cannot be the parent's (it lacks created_at) and goes,
    -- its non-unique twin serving the reads.
    ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_pkey,
        ADD CONSTRAINT ledger_entries_legacy_pkey PRIMARY KEY USING INDEX ledger_entries_created_key;
    DROP INDEX ledger_entries_event_sequence_idx;
    ALTER TABLE ledger_entries RENAME TO ledger_entries_legacy;
    ALTER INDEX ledger_entries_history_idx RENAME TO ledger_entries_legacy_history_idx;
    ALTER INDEX ledger_entries_overage_idx RENAME TO ledger_entries_legacy_overage_idx;
    ALTER INDEX ledger_entries_op_key_idx RENAME TO ledger_entries_legacy_op_key_idx;
    ALTER INDEX ledger_entries_history_type_idx RENAME TO ledger_entries_legacy_history_type_idx;
    ALTER INDEX ledger_entries_created_brin RENAME TO ledger_entries_legacy_created_brin;
    ALTER INDEX ledger_entries_event_seq_idx RENAME TO ledger_entries_legacy_event_seq_idx;

    CREATE TABLE ledger_entries (LIKE ledger_entries_legacy INCLUDING DEFAULTS)
        PARTITION BY RANGE (created_at);
    ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_pkey PRIMARY KEY (id, tenant_id, created_at);
    CREATE INDEX ledger_entries_history_idx ON ledger_entries (customer_id, created_at DESC, id DESC);
    CREATE INDEX ledger_entries_overage_idx
        ON ledger_entries (customer_id, created_at) INCLUDE (billable_metric_key, overage_mc)
        WHERE overage_mc > 0;
    CREATE INDEX ledger_entries_op_key_idx
        ON ledger_entries (hashtextextended(tenant_id::text || idempotency_key, 0))
        WHERE op_head IS NOT NULL;
    CREATE INDEX ledger_entries_history_type_idx ON ledger_entries (customer_id, type, created_at DESC, id DESC)
        WHERE type <> 'consumption';
    CREATE INDEX ledger_entries_created_brin ON ledger_entries USING brin (created_at);
    CREATE INDEX ledger_entries_event_seq_idx
        ON ledger_entries (tenant_id, event_sequence) WHERE event_sequence IS NOT NULL;

    EXECUTE format('ALTER TABLE ledger_entries ATTACH PARTITION ledger_entries_legacy
        FOR VALUES FROM (MINVALUE) TO (%L)', cut);
    CREATE TABLE ledger_entries_default PARTITION OF ledger_entries DEFAULT;
    FOR i IN 0..2 LOOP
        PERFORM credit_month_partition('ledger_entries',
            ((cut AT TIME ZONE 'UTC') + make_interval(months => i)) AT TIME ZONE 'UTC');
    END LOOP;
END
$$;
