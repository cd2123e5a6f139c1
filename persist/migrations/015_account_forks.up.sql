-- 015_account_forks: a Redis failover can fork a customer's history
-- (issue 11). The old master ran op L at version v and the persister stored
-- it; the promoted replica never got L, so its next op N on that customer
-- is also version v. Postgres must not take N's state (it lacks L), nor
-- N's entries without it (docs/decisions.md, "Failover divergence").
--
-- op_id is the op that set the stored version, so a second op at the same
-- version is told apart from a replay (NULL: written before this migration
-- or by a fence, never compared).
--
-- fenced_version fences a forked account: the persister refused an op of a
-- second history (a dead letter with sqlstate 23F01), moved the account's
-- version past every version the forked Redis could hold, and reloaded
-- Redis from Postgres; an entry of the forked history (version <=
-- fenced_version, not already in the ledger) is refused from then on.
-- Both live on the account row, so the check is the one primary-key probe
-- the account upsert makes anyway.
-- outbox_ms is the millisecond part of the stream id of the outbox entry
-- that set the version (Redis' clock at XADD; NULL when unknown, as for a
-- dead letter replayed by hand).
ALTER TABLE credit_accounts
    ADD COLUMN op_id          UUID,
    ADD COLUMN outbox_ms      BIGINT,
    ADD COLUMN fenced_version BIGINT,
    ADD COLUMN fenced_at      TIMESTAMPTZ;

-- credit_fork_check raises SQLSTATE 23F01 (an integrity violation: the
-- persister dead-letters the one Mutation and moves on) when a Mutation
-- (customer, version, op, outbox entry) would write a second history:
--   (a) the account stores that version from another op;
--   (b) its version is below the stored one, yet its outbox entry came
--       later (a greater stream id millisecond): a customer's entries all
--       go to one partition stream, whose ids grow with the versions along
--       one history, and a replica keeps the ids it replicated, so only a
--       Redis that lost the stored ops can append such an entry (a late
--       delivery of an older op, after a consumer died, has the smaller id);
--   (c) a fence covers its version.
-- (b) and (c) spare an op whose first ledger entry Postgres already holds
-- (a replay). The arrays are one row per state-changing Mutation of a
-- batch; entries holds the id of each one's first ledger entry (NULL:
-- none), outbox its entry's stream id milliseconds (0: unknown). It runs
-- before the batch inserts anything.
--
-- The accounts are read by customer_id = ANY (one index probe each, in any
-- plan) and matched to the elements in memory: a join of the unnested
-- arrays to the table gets a generic plan that may scan it whole.
CREATE FUNCTION credit_fork_check(customers UUID[], versions BIGINT[], ops UUID[], entries UUID[],
    outbox BIGINT[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    WITH a AS MATERIALIZED (
        SELECT customer_id, version, op_id, fenced_version, outbox_ms
        FROM credit_accounts WHERE customer_id = ANY(customers)
    )
    SELECT t.customer_id, t.version, t.op, t.outbox_ms, a.version AS stored, a.op_id AS stored_op, a.fenced_version,
        a.outbox_ms AS stored_ms
    INTO r
    FROM unnest(customers, versions, ops, entries, outbox) AS t(customer_id, version, op, entry, outbox_ms)
    JOIN a ON a.customer_id = t.customer_id
    WHERE (a.version = t.version AND a.op_id <> t.op)
       OR ((t.version <= a.fenced_version OR (t.version < a.version AND t.outbox_ms > a.outbox_ms))
           AND (t.entry IS NULL OR NOT EXISTS (SELECT 1 FROM ledger_entries e WHERE e.id = t.entry)))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'account % forked: op % at version % (outbox ms %), postgres holds version % from op % (outbox ms %, fenced up to %)',
            r.customer_id, r.op, r.version, r.outbox_ms, r.stored, r.stored_op, r.stored_ms, r.fenced_version
            USING ERRCODE = '23F01';
    END IF;
END
$$;
