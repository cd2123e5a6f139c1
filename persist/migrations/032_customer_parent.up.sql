-- 032_customer_parent: shared pools (issue 28 item 4; docs/rules.md
-- "Shared pools", docs/decisions.md "Shared pools").
--
-- parent_id is the customer whose credit this one spends once its own is
-- gone (one level: a parent has no parent). It carries no foreign key, as
-- the credit tables carry none: the API checks the parent is a live
-- customer of the same tenant and environment, and a tenant-sharded
-- Postgres needs no cross-row constraint. parent_draw_limit is the cap on
-- what the child draws per period, as engine.DrawLimit encodes it
-- ({period, time_zone, limit_mc, since}); Redis counts the draws in the
-- child's account hash and a rebuild sums the parent's pool_draw entries
-- that name the child (reference_id). Both nullable without a default:
-- adding them rewrites nothing.
ALTER TABLE customers
    ADD COLUMN parent_id UUID,
    ADD COLUMN parent_draw_limit JSONB CHECK (parent_draw_limit IS NULL OR jsonb_typeof(parent_draw_limit) = 'object');

-- A customer's children, for the one-level rule (a parent cannot become a
-- child) and the console's list.
CREATE INDEX customers_parent_idx ON customers (tenant_id, parent_id) WHERE parent_id IS NOT NULL AND deleted_at IS NULL;
