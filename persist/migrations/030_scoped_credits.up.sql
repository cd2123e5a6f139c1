-- 030_scoped_credits: credits scoped to metrics (issue 28 item 1;
-- docs/rules.md "Credits scoped to metrics", docs/decisions.md).
--
-- applies_to is the sorted billable metric keys a block pays for, NULL
-- for every metric (every existing row: a nullable column without a
-- default adds nothing to the table). It is set when the block is created
-- and never changes; the persister keeps it when a later Mutation of the
-- block does not name it (persist/ledger.go upsertBlocksSQL), and a rebuild
-- writes it back into the account hash (lua/load.go).
ALTER TABLE credit_blocks
    ADD COLUMN applies_to TEXT[] CHECK (applies_to IS NULL OR cardinality(applies_to) BETWEEN 1 AND 20);

-- Plan grants carry a scope for the blocks they grant (NULL: every metric).
ALTER TABLE plan_grants
    ADD COLUMN applies_to TEXT[] CHECK (applies_to IS NULL OR cardinality(applies_to) BETWEEN 1 AND 20);
