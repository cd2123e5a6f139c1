-- 025_created_brin: the seen filter's seeding reads only the operations of
-- the last hour or so, not the whole system of record (issue 26).
--
-- engine.SeenSeeder runs at every node start: it lists the keys applied
-- since its last seeding less an hour (persist/seen.go AppliedKeysSince),
-- and nothing indexed created_at, so every start read operations and
-- ledger_entries from end to end: minutes on a ledger of tens of millions
-- of rows, for a few thousand keys. Both tables are appended in about
-- created_at order, which is what a BRIN index needs: a few bytes per 128
-- pages instead of an entry per row (a b-tree would add ~30 B to every
-- consume, against issue 26's bytes per consume). TestSeedingReadsRecentOnly
-- holds it. A BRIN builds in one pass over the table; an operator with a
-- large ledger may build both CONCURRENTLY beforehand (IF NOT EXISTS).
CREATE INDEX IF NOT EXISTS operations_created_brin ON operations USING brin (created_at);
CREATE INDEX IF NOT EXISTS ledger_entries_created_brin ON ledger_entries USING brin (created_at);
