-- 012_ledger_draws: one ledger row per consume (issue 10). A consume, a
-- commit or a usage event that drained several blocks writes one debit
-- whose credit_block_id is NULL; what each block paid travels in the row
-- itself as two parallel arrays (block i paid draw_amounts[i]), so history
-- still shows which blocks paid without a side table's extra rows and
-- index, and the persister sends them as typed arrays (no JSON in
-- Postgres). Entries that drained one block keep credit_block_id and leave
-- both arrays NULL.
ALTER TABLE ledger_entries
    ADD COLUMN draw_block_ids UUID[],
    ADD COLUMN draw_amounts   BIGINT[];

-- Lean persister writes: a block's drain changes remaining_amount, which
-- the old partial index's predicate named, so every drain was a non-HOT
-- update inserting into both of the table's indexes. An index on
-- customer_id alone serves the rebuild's look-up (remaining_amount > 0 is
-- then a heap filter over a customer's few blocks) and lets a drain be a
-- HOT update. Free space on each page keeps the new row version on the
-- same page (accounts and blocks are rewritten on every operation).
DROP INDEX credit_blocks_live_idx;
CREATE INDEX credit_blocks_customer_idx ON credit_blocks (customer_id);
ALTER TABLE credit_blocks SET (fillfactor = 70);
ALTER TABLE credit_accounts SET (fillfactor = 70);
