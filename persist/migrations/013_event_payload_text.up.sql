-- 013_event_payload_text: webhook_events.payload is only ever written
-- whole and read back whole as the exact body delivered (payload::text);
-- text spares Postgres parsing a JSON document on every consume (issue 10
-- profile). Go builds every payload with encoding/json, so it is valid
-- JSON; the few rows the persister completes in SQL (grant and debit
-- events, missing the external id) still go through jsonb there.
ALTER TABLE webhook_events ALTER COLUMN payload TYPE text USING payload::text;
