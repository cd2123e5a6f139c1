-- 015_account_forks: a Redis failover can fork a customer's history
-- (issue 11). The old master ran op L at version v and the persister stored
-- it; the promoted replica never got L, so its next op N on that customer
-- is also version v. Postgres must not take N's state (it lacks L), nor
-- N's entries without it.
--
-- credit_accounts.op_id is the op that set the stored version, so a second
-- op at the same version is told apart from a replay (NULL: written before
-- this migration, never compared).
ALTER TABLE credit_accounts ADD COLUMN op_id UUID;

-- account_forks fences a forked customer: the persister refused an op of a
-- second history, reloaded Redis from Postgres at a version above every
-- version the forked Redis reached (fenced_version), and refuses any later
-- entry of the forked history (version <= fenced_version). One row per
-- customer; a second fork raises fenced_version.
-- The refused ops themselves are dead letters (sqlstate 23F01).
CREATE TABLE account_forks (
    customer_id    UUID PRIMARY KEY,
    tenant_id      UUID NOT NULL,
    environment    TEXT NOT NULL,
    -- fenced_version is above every version the forked Redis could hold
    -- when it was reloaded.
    fenced_version BIGINT NOT NULL,
    fenced_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- credit_fork_check raises SQLSTATE 23F01 (an integrity violation: the
-- persister dead-letters the one Mutation and moves on) when a Mutation
-- (customer, version, op) would write a second history: the account
-- stores that version from another op, or the customer's fork fenced it.
-- The arrays are one row per state-changing Mutation of a batch; entries
-- holds the id of each one's first ledger entry (NULL: none), so a replay
-- of an op Postgres already holds is never refused by the fence. It runs
-- before the batch inserts anything.
CREATE FUNCTION credit_fork_check(customers UUID[], versions BIGINT[], ops UUID[], entries UUID[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    SELECT t.customer_id, t.version, t.op, a.version AS stored, a.op_id AS stored_op, f.fenced_version
    INTO r
    FROM unnest(customers, versions, ops, entries) AS t(customer_id, version, op, entry)
    LEFT JOIN credit_accounts a ON a.customer_id = t.customer_id
    LEFT JOIN account_forks f ON f.customer_id = t.customer_id
    WHERE (a.version = t.version AND a.op_id IS NOT NULL AND a.op_id <> t.op)
       OR (t.version <= f.fenced_version
           AND (t.entry IS NULL OR NOT EXISTS (SELECT 1 FROM ledger_entries e WHERE e.id = t.entry)))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'account % forked: op % at version % (postgres holds version % from op %, fenced up to %)',
            r.customer_id, r.op, r.version, r.stored, r.stored_op, r.fenced_version
            USING ERRCODE = '23F01';
    END IF;
END
$$;
