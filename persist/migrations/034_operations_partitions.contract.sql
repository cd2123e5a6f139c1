-- 034_operations_partitions (contract): the switch of operations to a
-- table partitioned by month, as 033's contract switches the ledger (no
-- row copied: the table becomes operations_legacy, the partition of every
-- instant before the cut; see that file). Run once no node of a release
-- before 034 runs: their ON CONFLICT (tenant_id, idempotency_key, op_id)
-- needs the unique index dropped here.
DO $$
DECLARE
    newest TIMESTAMPTZ;
    cut TIMESTAMPTZ;
BEGIN
    SELECT max(created_at) INTO newest FROM operations;
    IF newest IS NULL THEN
        cut := date_trunc('month', now(), 'UTC');
    ELSE
        cut := ((date_trunc('month', GREATEST(now(), newest), 'UTC') AT TIME ZONE 'UTC')
            + INTERVAL '1 month') AT TIME ZONE 'UTC';
    END IF;
    EXECUTE format('ALTER TABLE operations ADD CONSTRAINT operations_legacy_range
        CHECK (created_at < %L) NOT VALID', cut);
    ALTER TABLE operations VALIDATE CONSTRAINT operations_legacy_range;

    -- The legacy table's key: the partitioned parent's is the expand's
    -- (tenant_id, idempotency_key, op_id, created_at), made its primary
    -- key (operations had none: every column of it is NOT NULL).
    DROP INDEX operations_tenant_key_op_key;
    ALTER TABLE operations ADD CONSTRAINT operations_legacy_pkey PRIMARY KEY USING INDEX operations_created_key;
    ALTER TABLE operations RENAME TO operations_legacy;
    ALTER INDEX operations_customer_idx RENAME TO operations_legacy_customer_idx;
    ALTER INDEX operations_created_brin RENAME TO operations_legacy_created_brin;

    CREATE TABLE operations (LIKE operations_legacy INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
    ALTER TABLE operations ADD CONSTRAINT operations_pkey
        PRIMARY KEY (tenant_id, idempotency_key, op_id, created_at);
    CREATE INDEX operations_customer_idx ON operations (customer_id, created_at);
    CREATE INDEX operations_created_brin ON operations USING brin (created_at);

    EXECUTE format('ALTER TABLE operations ATTACH PARTITION operations_legacy
        FOR VALUES FROM (MINVALUE) TO (%L)', cut);
    CREATE TABLE operations_default PARTITION OF operations DEFAULT;
    FOR i IN 0..2 LOOP
        PERFORM credit_month_partition('operations',
            ((cut AT TIME ZONE 'UTC') + make_interval(months => i)) AT TIME ZONE 'UTC');
    END LOOP;
END
$$;
