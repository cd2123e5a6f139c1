-- 028_carried_events: a lean consume's credit.consumed lives on its ledger
-- entry (issue 26 item 4: event rows do not copy what the ledger row
-- holds; docs/decisions.md, "Consume events carried by the ledger").
--
-- event_sequence is the event's place among its tenant's events, set only
-- on the main entry of a lean consume that owed a credit.consumed; the
-- event itself (id, body) is rebuilt from the entry (persist/carried.go).
-- The partial index pages a tenant's carried events by sequence, as
-- webhook_events_sequence_idx pages the stored ones; it holds those
-- entries only.
ALTER TABLE ledger_entries ADD COLUMN event_sequence BIGINT;

CREATE UNIQUE INDEX ledger_entries_event_sequence_idx
    ON ledger_entries (tenant_id, event_sequence) WHERE event_sequence IS NOT NULL;

-- A tenant with a webhook URL gets its carried events copied into
-- webhook_events (where delivery keeps its state) in sequence order;
-- through is the last sequence up to which every carried event of the
-- tenant has its row there, so reads take carried events after it only.
CREATE TABLE event_carried_through (
    tenant_id UUID PRIMARY KEY,
    through   BIGINT NOT NULL
);
