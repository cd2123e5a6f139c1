-- 002_outbox_dead_letters: outbox entries the persister can never write
-- (undecodable JSON, or a Mutation Postgres refuses as data, such as a NUL
-- in text). They are kept here, whole, before being acknowledged, so one bad
-- entry neither stalls its partition nor disappears.
CREATE TABLE outbox_dead_letters (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    partition  INTEGER NOT NULL,
    entry_id   TEXT NOT NULL,
    -- raw is BYTEA: the bytes may be anything, NULs included.
    raw        BYTEA NOT NULL,
    error      TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX outbox_dead_letters_entry_idx ON outbox_dead_letters (partition, entry_id);
