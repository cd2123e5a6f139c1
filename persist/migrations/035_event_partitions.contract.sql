-- 035_event_partitions (contract): the switch of webhook_events and
-- webhook_deliveries to tables partitioned by month, as 033's contract
-- switches the ledger (no row copied: each table becomes <table>_legacy,
-- the partition of every instant before its cut; see that file). Run once
-- no node of a release before 035 runs: their ON CONFLICT (id, tenant_id)
-- on webhook_events needs the primary key dropped here, and they may date
-- an attempt before its event (below).
DO $$
DECLARE
    newest TIMESTAMPTZ;
    cut TIMESTAMPTZ;
BEGIN
    -- From 035 on an attempt is dated no earlier than its event
    -- (persist/events.go recordAttemptSQL), so reading an event's
    -- attempts can leave out the months before the event. The previous
    -- release dated an attempt by the delivering node's clock alone: the
    -- few a clock behind the event's dated before it are moved up to it.
    UPDATE webhook_deliveries d SET created_at = e.created_at
    FROM webhook_events e
    WHERE e.id = d.event_id AND e.tenant_id = d.tenant_id AND d.created_at < e.created_at;

    SELECT max(created_at) INTO newest FROM webhook_events;
    IF newest IS NULL THEN
        cut := date_trunc('month', now(), 'UTC');
    ELSE
        cut := ((date_trunc('month', GREATEST(now(), newest), 'UTC') AT TIME ZONE 'UTC')
            + INTERVAL '1 month') AT TIME ZONE 'UTC';
    END IF;
    EXECUTE format('ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_legacy_range
        CHECK (created_at < %L) NOT VALID', cut);
    ALTER TABLE webhook_events VALIDATE CONSTRAINT webhook_events_legacy_range;

    -- The legacy table's keys: the parent's primary key is the expand's
    -- (id, tenant_id, created_at); the unique sequence index cannot be the
    -- parent's (it lacks created_at) and goes, its non-unique twin
    -- serving the reads.
    ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_pkey,
        ADD CONSTRAINT webhook_events_legacy_pkey PRIMARY KEY USING INDEX webhook_events_created_key;
    DROP INDEX webhook_events_sequence_idx;
    ALTER TABLE webhook_events RENAME TO webhook_events_legacy;
    ALTER INDEX webhook_events_due_tenant_idx RENAME TO webhook_events_legacy_due_tenant_idx;
    ALTER INDEX webhook_events_list_idx RENAME TO webhook_events_legacy_list_idx;
    ALTER INDEX webhook_events_seq_idx RENAME TO webhook_events_legacy_seq_idx;

    CREATE TABLE webhook_events (LIKE webhook_events_legacy INCLUDING DEFAULTS) PARTITION BY RANGE (created_at);
    ALTER TABLE webhook_events ADD CONSTRAINT webhook_events_pkey PRIMARY KEY (id, tenant_id, created_at);
    CREATE INDEX webhook_events_due_tenant_idx ON webhook_events (tenant_id, next_retry_at)
        WHERE status IN ('pending', 'failed');
    CREATE INDEX webhook_events_list_idx ON webhook_events (tenant_id, created_at DESC, id DESC);
    CREATE INDEX webhook_events_seq_idx ON webhook_events (tenant_id, sequence);

    EXECUTE format('ALTER TABLE webhook_events ATTACH PARTITION webhook_events_legacy
        FOR VALUES FROM (MINVALUE) TO (%L)', cut);
    CREATE TABLE webhook_events_default PARTITION OF webhook_events DEFAULT;
    FOR i IN 0..2 LOOP
        PERFORM credit_month_partition('webhook_events',
            ((cut AT TIME ZONE 'UTC') + make_interval(months => i)) AT TIME ZONE 'UTC');
    END LOOP;

    -- webhook_deliveries: append-only, one row per attempt.
    SELECT max(created_at) INTO newest FROM webhook_deliveries;
    IF newest IS NULL THEN
        cut := date_trunc('month', now(), 'UTC');
    ELSE
        cut := ((date_trunc('month', GREATEST(now(), newest), 'UTC') AT TIME ZONE 'UTC')
            + INTERVAL '1 month') AT TIME ZONE 'UTC';
    END IF;
    EXECUTE format('ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_legacy_range
        CHECK (created_at < %L) NOT VALID', cut);
    ALTER TABLE webhook_deliveries VALIDATE CONSTRAINT webhook_deliveries_legacy_range;

    ALTER TABLE webhook_deliveries DROP CONSTRAINT webhook_deliveries_pkey,
        ADD CONSTRAINT webhook_deliveries_legacy_pkey PRIMARY KEY USING INDEX webhook_deliveries_created_key;
    ALTER TABLE webhook_deliveries RENAME TO webhook_deliveries_legacy;
    ALTER INDEX webhook_deliveries_event_idx RENAME TO webhook_deliveries_legacy_event_idx;

    CREATE TABLE webhook_deliveries (LIKE webhook_deliveries_legacy INCLUDING DEFAULTS)
        PARTITION BY RANGE (created_at);
    ALTER TABLE webhook_deliveries ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id, tenant_id, created_at);
    CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id, created_at, id);

    EXECUTE format('ALTER TABLE webhook_deliveries ATTACH PARTITION webhook_deliveries_legacy
        FOR VALUES FROM (MINVALUE) TO (%L)', cut);
    CREATE TABLE webhook_deliveries_default PARTITION OF webhook_deliveries DEFAULT;
    FOR i IN 0..2 LOOP
        PERFORM credit_month_partition('webhook_deliveries',
            ((cut AT TIME ZONE 'UTC') + make_interval(months => i)) AT TIME ZONE 'UTC');
    END LOOP;
END
$$;
