-- operations.mutation is only ever read back whole by Go (rebuild, usage
-- look-ups): text spares Postgres parsing and re-encoding a JSON document
-- on every money-moving operation (issue 6 profile).
ALTER TABLE operations ALTER COLUMN mutation TYPE text USING mutation::text;
