-- 024_history_type_index: a customer's history filtered by type reads only
-- the entries of that type (issue 31 item 6).
--
-- The history index (customer_id, created_at DESC, id DESC) answers the
-- unfiltered page, but with ?type= Postgres walked it newest first and
-- dropped every entry of another type (the generic plan of History's
-- prepared statement), or scanned the table and sorted it (a type with no
-- entries): a filter matching few or no entries read the customer's whole
-- ledger, so its cost grew with the ledger (docs/limits.md, the console's
-- page time). With type second, a filtered page is one range of this index
-- in the page's order: the first limit+1 entries of the type, then stop,
-- whatever the ledger's size; the (created_at, id) cursor and from/to stay
-- range conditions on it. TestHistoryTypeFilterPlan (persist) holds it.
--
-- Consumption entries are left out: they are most of any ledger (one per
-- consume), so the history index's walk finds a page of them at once,
-- and indexing them would cost every consume ~130 B of Postgres
-- (TestLeanRecordsPerConsume, issue 26's bytes per consume). A generic
-- plan, where type is a parameter, can only use this partial index when
-- the statement states its predicate, so History's statement for any other
-- type says "type <> 'consumption'" in its text (persist/reader.go
-- historySQL). IF NOT EXISTS: an operator with a large ledger may build it
-- CONCURRENTLY by hand first, so that this transaction does not hold
-- writes to ledger_entries while it builds.
CREATE INDEX IF NOT EXISTS ledger_entries_history_type_idx ON ledger_entries (customer_id, type, created_at DESC, id DESC)
    WHERE type <> 'consumption';

-- The topup list (persist/topups.go) reads this index now: its type =
-- 'topup' implies the predicate, and the order is the same. Kept, the
-- topups' own partial index tempted the planner into a bitmap scan and a
-- sort of all a customer's top-ups for a page of history.
DROP INDEX IF EXISTS ledger_entries_topups_idx;
