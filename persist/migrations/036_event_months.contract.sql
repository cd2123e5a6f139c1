-- 036_event_months (contract): the spans' trigger on the webhook_events of
-- 035's contract. Contracts run in order, so on a database that took 036's
-- expand before 035's contract the trigger went with the old table, now
-- webhook_events_legacy, and the new partitioned table has none: readers
-- have read every month since (persist/eventmonths.go). The trigger moves
-- to the parent (a row trigger would clone to the partitions; a statement
-- trigger fires for the table a statement names) and the spans take in
-- the rows stored meanwhile, under the trigger's lock, so readers trust
-- them again from this commit. Then the events the previous release
-- dead-lettered, which it did not index, are indexed (no node of it runs).
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
            WHERE c.relname = 'webhook_events_legacy' AND t.tgname = 'webhook_events_months')
        OR NOT EXISTS (SELECT 1 FROM pg_trigger
            WHERE tgrelid = 'webhook_events'::regclass AND tgname = 'webhook_events_months') THEN
        -- The parent first, then its partitions, as every writer locks
        -- them: dropping the trigger of the partition first deadlocked
        -- with a writer holding the parent and reading every month
        -- (persist/events.go insertEventSQL's look-up by id).
        LOCK TABLE webhook_events IN SHARE ROW EXCLUSIVE MODE;
        IF to_regclass('webhook_events_legacy') IS NOT NULL THEN
            DROP TRIGGER IF EXISTS webhook_events_months ON webhook_events_legacy;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger
                WHERE tgrelid = 'webhook_events'::regclass AND tgname = 'webhook_events_months') THEN
            CREATE TRIGGER webhook_events_months AFTER INSERT ON webhook_events
                REFERENCING NEW TABLE AS added
                FOR EACH STATEMENT EXECUTE FUNCTION webhook_event_months_add();
            INSERT INTO webhook_event_months AS m (tenant_id, month, low, high)
            SELECT tenant_id, date_trunc('month', created_at, 'UTC'), min(sequence), max(sequence)
            FROM webhook_events WHERE sequence IS NOT NULL
            GROUP BY 1, 2
            ON CONFLICT (tenant_id, month) DO UPDATE
                SET low = LEAST(m.low, EXCLUDED.low), high = GREATEST(m.high, EXCLUDED.high);
        END IF;
    END IF;
END
$$;

INSERT INTO webhook_event_dead (id, tenant_id, created_at)
SELECT id, tenant_id, created_at FROM webhook_events WHERE status = 'dead_letter'
ON CONFLICT DO NOTHING;
