-- 036_event_months (expand): what lets the reads of month-partitioned
-- events (migration 035) that know no instant read only the months that
-- can hold their answer (issue 30 item 1; docs/decisions.md "What prunes").
--
-- The events list and the stream's catch-up page by (tenant_id, sequence).
-- A sequence is handed out at insert and the instant is the Mutation's, so
-- the persister's lag (or a carried event copied into a row late,
-- persist/carried.go) stores an old-dated event with a new sequence: no
-- created_at bound follows from a sequence. webhook_event_months keeps,
-- per tenant and month of created_at (UTC), the lowest and highest
-- sequence stored in that month; a page reads the months whose span meets
-- its sequence window (persist/eventmonths.go). A span only widens, so a
-- row deleted later leaves it too wide, never too narrow.
CREATE TABLE webhook_event_months (
    tenant_id UUID NOT NULL,
    month     TIMESTAMPTZ NOT NULL,
    low       BIGINT NOT NULL,
    high      BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, month)
);

-- The spans are kept by a statement trigger, in the inserting transaction,
-- so every writer keeps them, the previous release's nodes too (they run
-- beside this one until the contract), and COPY as well as INSERT. One
-- upsert per statement and (tenant, month): the inserting transaction
-- already holds the tenant's counter row (event_sequences), so this row
-- adds no wait a writer of the tenant did not have; rows in sorted order,
-- so two statements lock them in one order.
CREATE FUNCTION webhook_event_months_add() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO webhook_event_months AS m (tenant_id, month, low, high)
    SELECT tenant_id, date_trunc('month', created_at, 'UTC'), min(sequence), max(sequence)
    FROM added WHERE sequence IS NOT NULL
    GROUP BY 1, 2 ORDER BY 1, 2
    ON CONFLICT (tenant_id, month) DO UPDATE
        SET low = LEAST(m.low, EXCLUDED.low), high = GREATEST(m.high, EXCLUDED.high)
        WHERE EXCLUDED.low < m.low OR EXCLUDED.high > m.high;
    RETURN NULL;
END
$$;

-- Readers trust the spans only while this trigger is on webhook_events
-- (persist/eventmonths.go eventMonthsReadySQL): 035's contract replaces
-- the table, and 036's contract puts the trigger on the new one.
CREATE TRIGGER webhook_events_months AFTER INSERT ON webhook_events
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION webhook_event_months_add();

-- The events stored so far. CREATE TRIGGER holds the table's writers from
-- here to this transaction's commit, so no row is missed between the two
-- (one scan of the events: docs/decisions.md "What prunes").
INSERT INTO webhook_event_months AS m (tenant_id, month, low, high)
SELECT tenant_id, date_trunc('month', created_at, 'UTC'), min(sequence), max(sequence)
FROM webhook_events WHERE sequence IS NOT NULL
GROUP BY 1, 2
ON CONFLICT (tenant_id, month) DO UPDATE
    SET low = LEAST(m.low, EXCLUDED.low), high = GREATEST(m.high, EXCLUDED.high);

-- Redeliver names an event by id, and an event id (engine.EventID, a
-- version 5 UUID of the op and slot) carries no time. Only a dead-lettered
-- event can be redelivered, so the instant of each event that was ever
-- dead-lettered is kept here (recordAttemptSQL writes it with the
-- attempt), and redeliver updates the event in its month. An id's instant
-- never changes, so a row stays right after the event is redelivered; an
-- event missing here (dead-lettered by the previous release) is found as
-- before, by a probe of each month.
CREATE TABLE webhook_event_dead (
    id         UUID NOT NULL,
    tenant_id  UUID NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (id, tenant_id)
);
INSERT INTO webhook_event_dead (id, tenant_id, created_at)
SELECT id, tenant_id, created_at FROM webhook_events WHERE status = 'dead_letter'
ON CONFLICT DO NOTHING;
