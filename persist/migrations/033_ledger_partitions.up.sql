-- 033_ledger_partitions (expand): the ledger partitioned by month (issue 30
-- item 1; docs/scaling.md "Ledger partitioned by month", docs/decisions.md
-- "The ledger by month").
--
-- A partitioned table's unique keys must include its partition key, so
-- the partitioned ledger's primary key is (id, tenant_id, created_at), and
-- the persister says ON CONFLICT (id, tenant_id, created_at): a replayed
-- Mutation carries the same entry ids and the same instant, so it still
-- inserts nothing twice. This step only adds what that statement needs on
-- the table as it is (a unique index on those columns) and what the switch
-- will need (the non-unique event sequence index, and the function that
-- creates a month), so the previous release keeps writing with
-- ON CONFLICT (id, tenant_id). The switch itself is
-- 033_ledger_partitions.contract.sql, run once no node of that release
-- runs (persist/migrate.go). IF NOT EXISTS: on a large ledger an operator
-- may build both indexes CONCURRENTLY by hand first.
CREATE UNIQUE INDEX IF NOT EXISTS ledger_entries_created_key ON ledger_entries (id, tenant_id, created_at);
CREATE INDEX IF NOT EXISTS ledger_entries_event_seq_idx
    ON ledger_entries (tenant_id, event_sequence) WHERE event_sequence IS NOT NULL;

-- credit_month_partition makes parent's partition of the UTC month holding
-- month (parent_pYYYYMM) unless it exists, and says whether it made it.
-- Rows of that month already in the DEFAULT partition (parent_default: an
-- alarm, they should never be there) move into it in the same transaction,
-- since Postgres refuses a partition whose range the default holds rows of.
-- Creators of one table's partitions are serialized by a transaction lock
-- per parent (two creating different months at once would deadlock on the
-- parent and its DEFAULT partition); the caller bounds the wait with
-- lock_timeout (creating a partition locks the parent briefly).
CREATE FUNCTION credit_month_partition(parent TEXT, month TIMESTAMPTZ) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
DECLARE
    lo TIMESTAMPTZ := date_trunc('month', month, 'UTC');
    hi TIMESTAMPTZ := ((date_trunc('month', month, 'UTC') AT TIME ZONE 'UTC') + INTERVAL '1 month') AT TIME ZONE 'UTC';
    name TEXT := parent || '_p' || to_char(lo AT TIME ZONE 'UTC', 'YYYYMM');
    def TEXT := parent || '_default';
    strays BOOLEAN := false;
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('credit_month_partition'), hashtext(parent));
    -- Read pg_class with this statement's snapshot: to_regclass may not
    -- have seen the partition another creator committed while we waited.
    IF EXISTS (SELECT 1 FROM pg_class WHERE relname = name AND relnamespace = current_schema()::regnamespace) THEN
        RETURN false;
    END IF;
    IF to_regclass(def) IS NOT NULL THEN
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE created_at >= $1 AND created_at < $2)', def)
            INTO strays USING lo, hi;
    END IF;
    IF strays THEN
        EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name, parent);
        EXECUTE format('WITH m AS (DELETE FROM %I WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
            'INSERT INTO %I SELECT * FROM m', def, name) USING lo, hi;
        EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)', parent, name, lo, hi);
    ELSE
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES FROM (%L) TO (%L)', name, parent, lo, hi);
    END IF;
    RETURN true;
END
$$;
