-- 017_event_sequence: ordered, replayable events (issue 15 item 2). Every
-- event carries a per-tenant sequence with no gaps and, when a Mutation
-- produced it, the customer's account version. The sequence is taken from
-- the tenant's counter row (event_sequences.next is the last sequence
-- handed out) in the same statement that inserts the events, so a rolled
-- back transaction hands out nothing and the counter's row lock orders a
-- tenant's writers.
ALTER TABLE webhook_events ADD COLUMN sequence BIGINT, ADD COLUMN account_version BIGINT;

CREATE TABLE event_sequences (
    tenant_id UUID PRIMARY KEY,
    next      BIGINT NOT NULL
);

-- Events stored before this migration are numbered in (created_at, id)
-- order, their payloads given the sequence as new ones are, so every row
-- has one and the counter continues after them.
WITH numbered AS (
    SELECT id, row_number() OVER (PARTITION BY tenant_id ORDER BY created_at, id) AS seq
    FROM webhook_events
)
UPDATE webhook_events e SET sequence = n.seq, payload = '{"sequence":' || n.seq || ',' || substr(e.payload, 2)
FROM numbered n WHERE e.id = n.id;

INSERT INTO event_sequences (tenant_id, next)
SELECT tenant_id, max(sequence) FROM webhook_events GROUP BY tenant_id;

-- Paging by sequence (GET /v1/events) and the stream's poll (one tenant,
-- sequence after the last seen).
CREATE UNIQUE INDEX webhook_events_sequence_idx ON webhook_events (tenant_id, sequence);
