-- 011_dead_letter_alarm: a dead letter is an alarm until an operator
-- replays it (invariant 12). Each row names the Mutation it holds (op,
-- tenant, customer, kind, account version) so the persister can hold the
-- account's later mutations behind it and `creditd deadletters retry` can
-- replay them in version order; resolved_at is set in the transaction that
-- finally writes the Mutation, so a replay happens exactly once.
ALTER TABLE outbox_dead_letters
    ADD COLUMN op_id           UUID,
    ADD COLUMN tenant_id       UUID,
    ADD COLUMN customer_id     UUID,
    ADD COLUMN kind            TEXT,
    ADD COLUMN account_version BIGINT,
    -- sqlstate is Postgres' refusal code; NULL for undecodable entries and
    -- for mutations held behind an earlier dead letter of their account.
    ADD COLUMN sqlstate        TEXT,
    -- held_by is the dead letter this one waits behind (NULL: refused itself).
    ADD COLUMN held_by         BIGINT,
    ADD COLUMN retries         INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN retry_error     TEXT,
    ADD COLUMN resolved_at     TIMESTAMPTZ,
    -- resolution says how: 'replayed', or 'discarded: <operator note>'.
    ADD COLUMN resolution      TEXT;

-- Rows written before this migration carry the Mutation only in raw: read
-- the names out of it where it is JSON at all. A \u0000 escape (the usual
-- reason for the dead letter) would make Postgres refuse the whole
-- document, so it is blanked first; the names read never contain one.
DO $$
DECLARE
    r RECORD;
    doc json;
BEGIN
    FOR r IN SELECT id, raw FROM outbox_dead_letters LOOP
        BEGIN
            doc := replace(convert_from(r.raw, 'UTF8'), '\u0000', '?')::json;
            UPDATE outbox_dead_letters SET
                op_id = (doc->>'op')::uuid,
                tenant_id = (doc->>'tenant')::uuid,
                customer_id = (doc->>'customer')::uuid,
                kind = doc->>'kind',
                account_version = (doc->'account'->>'version')::bigint
            WHERE id = r.id;
        EXCEPTION WHEN OTHERS THEN
            NULL; -- undecodable: listed and kept, never replayable
        END;
    END LOOP;
END $$;

-- The alarm's count and the persister's hold look-up read unresolved rows
-- only; resolved ones stay as the audit trail.
CREATE INDEX outbox_dead_letters_unresolved_idx
    ON outbox_dead_letters (customer_id, account_version, id) WHERE resolved_at IS NULL;
