-- 035_event_partitions (expand): webhook_events and webhook_deliveries
-- partitioned by month like the ledger (issue 30 item 1; migrations 033
-- and 034, docs/decisions.md "The ledger by month").
--
-- A partitioned table's unique keys must include created_at. An event's
-- id and instant both come from what made it (engine.EventID of the
-- Mutation's op and the Mutation's instant; a carried event's from its
-- ledger entry), so ON CONFLICT (id, tenant_id, created_at) still skips a
-- replay. This step adds that key on the table as it is, for this
-- release's statements; the previous release's ON CONFLICT (id, tenant_id)
-- keeps its primary key until 035_event_partitions.contract.sql switches
-- the tables. (tenant_id, sequence) cannot stay unique either: its
-- non-unique twin serves the reads once the switch drops the unique one
-- (the tenant's counter row in event_sequences hands out each sequence
-- once, as for the ledger's carried events). A delivery is never upserted;
-- its key is added here so the switch need not build it under its lock.
-- IF NOT EXISTS: an operator may build these CONCURRENTLY by hand first.
CREATE UNIQUE INDEX IF NOT EXISTS webhook_events_created_key ON webhook_events (id, tenant_id, created_at);
CREATE INDEX IF NOT EXISTS webhook_events_seq_idx ON webhook_events (tenant_id, sequence);
CREATE UNIQUE INDEX IF NOT EXISTS webhook_deliveries_created_key
    ON webhook_deliveries (id, tenant_id, created_at);
