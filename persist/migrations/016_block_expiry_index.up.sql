-- 016_block_expiry_index: the expiry sweep asks Postgres which customers
-- have a block past its expires_at with credit left (issue 10: Redis kept a
-- zset member per customer with an expiring block, ~190 bytes each, for
-- this). expires_at never changes after a block is written, so the index
-- does not stop a drain's update of remaining_amount from being HOT
-- (migration 012); the query filters remaining_amount on the heap over
-- the few blocks of its time window.
CREATE INDEX credit_blocks_expires_idx ON credit_blocks (expires_at) WHERE expires_at IS NOT NULL;
