-- 037_carried_months (contract): the spans of the carried events the
-- previous release's nodes stored (they kept none). This release's nodes
-- keep the spans of what they write, beside this statement (a span only
-- widens, so the two upserts commute). Recorded in schema_contracts with
-- this statement's commit: readers trust the spans from then on
-- (persist/carried.go carriedEventsSQL). One scan of the ledger's carried
-- entries, by their partial (tenant_id, event_sequence) index; writers do
-- not wait for it but on the span rows both upsert, which both take in
-- (tenant, month) order, so neither waits on the other in a cycle.
INSERT INTO ledger_event_months AS m (tenant_id, month, low, high)
SELECT tenant_id, date_trunc('month', created_at, 'UTC'), min(event_sequence), max(event_sequence)
FROM ledger_entries WHERE event_sequence IS NOT NULL
GROUP BY 1, 2 ORDER BY 1, 2
ON CONFLICT (tenant_id, month) DO UPDATE
    SET low = LEAST(m.low, EXCLUDED.low), high = GREATEST(m.high, EXCLUDED.high);
