-- 022_outbox_leases: one persister of a fleet owns an outbox partition at a
-- time (issue 25, engine.OutboxLeases); each take of a partition's lease
-- has a fencing token greater than the one before. outbox_leases holds the
-- greatest token a commit of the partition's entries came with, and
-- credit_outbox_fence, run first in every persister transaction, moves it
-- up or refuses the transaction with SQLSTATE 55F01 when it came with a
-- smaller one: a stalled ex-owner cannot commit entries after its
-- successor committed later ones. The row lock the upsert takes (even when
-- the token is not newer) makes two owners' transactions on a partition
-- wait for each other, so the successor's first commit comes after the
-- ex-owner's last or refuses it. A write that holds no lease (a dead letter
-- replayed by hand, a persister without leases) runs no fence.
CREATE TABLE outbox_leases (
    partition  INT PRIMARY KEY,
    token      BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE FUNCTION credit_outbox_fence(parts INT[], tokens BIGINT[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    INSERT INTO outbox_leases AS l (partition, token)
    SELECT p, t FROM unnest(parts, tokens) AS u(p, t) ORDER BY p
    ON CONFLICT (partition) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
        WHERE l.token < EXCLUDED.token;
    SELECT u.p, u.t, l.token AS stored INTO r
    FROM unnest(parts, tokens) AS u(p, t) JOIN outbox_leases l ON l.partition = u.p
    WHERE l.token > u.t
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'outbox partition % lease % is stale: postgres holds lease %', r.p, r.t, r.stored
            USING ERRCODE = '55F01';
    END IF;
END
$$;
