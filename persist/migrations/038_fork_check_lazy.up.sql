-- 038_fork_check_lazy: credit_fork_check (015) looks an entry up in the
-- ledger only for a Mutation the account's fence or outbox instant makes
-- suspect, as it meant to. Its condition was "(suspect) AND (no entry
-- or the entry is not in the ledger)", and the suspect test is NULL, not
-- false, for an account never fenced (fenced_version NULL) or whose
-- outbox instant is unknown: SQL's AND stops only at false, so the ledger
-- look-up ran for every Mutation of every group the persister wrote, one
-- index probe in each partition of the ledger (no partition is pruned:
-- the entry's instant is not known here). Measured on a ledger of 50,000
-- rows in 5 partitions, 150 Mutations: 150 look-ups and 1,046 buffers
-- against none and 596 after (docs/decisions.md "The fork check's
-- ledger look-up"). A CASE evaluates its THEN only when its WHEN is true,
-- so the answer is the same for every row: a NULL suspect test never
-- selected the row before (NULL AND x is never true) and is false now.
-- The signature is unchanged: the previous release's nodes call the same
-- function and get the same answers (expand only).
CREATE OR REPLACE FUNCTION credit_fork_check(customers UUID[], versions BIGINT[], ops UUID[], entries UUID[],
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
       OR CASE WHEN t.version <= a.fenced_version OR (t.version < a.version AND t.outbox_ms > a.outbox_ms)
           THEN t.entry IS NULL OR NOT EXISTS (SELECT 1 FROM ledger_entries e WHERE e.id = t.entry)
           ELSE false END
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'account % forked: op % at version % (outbox ms %), postgres holds version % from op % (outbox ms %, fenced up to %)',
            r.customer_id, r.op, r.version, r.outbox_ms, r.stored, r.stored_op, r.stored_ms, r.fenced_version
            USING ERRCODE = '23F01';
    END IF;
END
$$;
