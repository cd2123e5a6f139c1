-- 031_tenant_keys (expand): ready for a tenant-sharded Postgres (issue 30
-- item 2; docs/scaling.md "Moving to a tenant-sharded Postgres",
-- docs/decisions.md "Tenant keys: expand now, contract later").
--
-- A distributed Postgres (Citus-style, distribution column tenant_id) can
-- only enforce a primary key or unique constraint that includes the
-- distribution column, and only a foreign key that includes it on both
-- sides (or points at a reference table). This step adds, next to every
-- key that lacks tenant_id, the same key with tenant_id appended, and moves
-- the foreign keys between tenant tables onto those keys.
--
-- tenant_id goes last: every probe the code makes by id or customer_id
-- keeps using the index's leading column, and Citus asks only that the
-- key contain the column, not where.
--
-- Expand only: the old single-column keys stay, because the previous
-- release's statements say ON CONFLICT (id) (or (customer_id), ...) and
-- Postgres needs a unique index on exactly those columns to accept them.
-- 031_tenant_keys.contract.sql drops them once no node of that release
-- runs: `creditd migrate contract`, or at once on a fresh database
-- (persist/migrate.go). IF NOT EXISTS: an operator with a large ledger may
-- build ledger_entries_tenant_pkey CONCURRENTLY by hand first, so that this
-- transaction does not hold the persister while it builds.

CREATE UNIQUE INDEX IF NOT EXISTS customers_tenant_pkey ON customers (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS credit_accounts_tenant_pkey ON credit_accounts (customer_id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS credit_blocks_tenant_pkey ON credit_blocks (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS ledger_entries_tenant_pkey ON ledger_entries (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS billable_metrics_tenant_pkey ON billable_metrics (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS metering_rules_tenant_pkey ON metering_rules (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS reservations_tenant_pkey ON reservations (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS gauges_tenant_pkey ON gauges (customer_id, metric_key, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS webhook_events_tenant_pkey ON webhook_events (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS plans_tenant_pkey ON plans (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS plan_variants_tenant_pkey ON plan_variants (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS plan_grants_tenant_pkey ON plan_grants (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS variant_entitlements_tenant_pkey ON variant_entitlements (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS subscriptions_tenant_pkey ON subscriptions (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS subscription_overrides_tenant_pkey ON subscription_overrides (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS gauge_leases_tenant_pkey ON gauge_leases (id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS credit_alert_states_tenant_pkey ON credit_alert_states (customer_id, tenant_id);
CREATE UNIQUE INDEX IF NOT EXISTS usage_hourly_tenant_pkey
    ON usage_hourly (customer_id, hour_start, billable_metric_key, tenant_id);

-- The unique keys that are not primary keys get a twin with tenant_id
-- (suffix _t); the contract drops the old one and gives the twin its name.
-- Code that tells a violation by its constraint name accepts both
-- (persist/directory.go isUniqueViolation).
ALTER TABLE variant_entitlements
    ADD CONSTRAINT variant_entitlements_key_t UNIQUE (plan_variant_id, billable_metric_key, tenant_id);
CREATE UNIQUE INDEX subscriptions_one_live_t ON subscriptions (customer_id, tenant_id)
    WHERE status IN ('trialing', 'active', 'past_due', 'paused');
CREATE UNIQUE INDEX subscription_overrides_one_per_metric_t
    ON subscription_overrides (subscription_id, billable_metric_key, tenant_id) WHERE deleted_at IS NULL;
CREATE UNIQUE INDEX credit_alert_settings_customer_t
    ON credit_alert_settings (customer_id, tenant_id) WHERE customer_id IS NOT NULL;

-- webhook_deliveries had no tenant_id: it gains its event's. The previous
-- release inserts attempts without it, so until the contract a trigger
-- fills it from the event (the attempt's event row always exists first:
-- the delivery worker claimed it).
ALTER TABLE webhook_deliveries ADD COLUMN tenant_id UUID;
UPDATE webhook_deliveries d SET tenant_id = e.tenant_id
FROM webhook_events e WHERE e.id = d.event_id AND d.tenant_id IS NULL;
CREATE FUNCTION webhook_deliveries_tenant() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id IS NULL THEN
        SELECT tenant_id INTO NEW.tenant_id FROM webhook_events WHERE id = NEW.event_id;
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER webhook_deliveries_tenant BEFORE INSERT ON webhook_deliveries
    FOR EACH ROW EXECUTE FUNCTION webhook_deliveries_tenant();
CREATE UNIQUE INDEX webhook_deliveries_tenant_pkey ON webhook_deliveries (id, tenant_id);

-- Foreign keys between tenant tables carry tenant_id on both sides, so a
-- row can only point at a row of its own tenant (on one shard). Swapping
-- them changes nothing for either release's statements: both write the
-- same tenant on both rows, and a violation is SQLSTATE 23503 either way.
ALTER TABLE plan_variants DROP CONSTRAINT plan_variants_plan_id_fkey,
    ADD CONSTRAINT plan_variants_plan_fkey FOREIGN KEY (plan_id, tenant_id) REFERENCES plans (id, tenant_id);
ALTER TABLE plan_grants DROP CONSTRAINT plan_grants_plan_variant_id_fkey,
    ADD CONSTRAINT plan_grants_variant_fkey FOREIGN KEY (plan_variant_id, tenant_id)
        REFERENCES plan_variants (id, tenant_id);
ALTER TABLE variant_entitlements DROP CONSTRAINT variant_entitlements_plan_variant_id_fkey,
    ADD CONSTRAINT variant_entitlements_variant_fkey FOREIGN KEY (plan_variant_id, tenant_id)
        REFERENCES plan_variants (id, tenant_id);
ALTER TABLE subscriptions DROP CONSTRAINT subscriptions_customer_id_fkey,
    DROP CONSTRAINT subscriptions_plan_id_fkey,
    DROP CONSTRAINT subscriptions_plan_variant_id_fkey,
    ADD CONSTRAINT subscriptions_customer_fkey FOREIGN KEY (customer_id, tenant_id)
        REFERENCES customers (id, tenant_id),
    ADD CONSTRAINT subscriptions_plan_fkey FOREIGN KEY (plan_id, tenant_id) REFERENCES plans (id, tenant_id),
    ADD CONSTRAINT subscriptions_variant_fkey FOREIGN KEY (plan_variant_id, tenant_id)
        REFERENCES plan_variants (id, tenant_id);
ALTER TABLE credit_alert_settings DROP CONSTRAINT credit_alert_settings_customer_id_fkey,
    ADD CONSTRAINT credit_alert_settings_customer_fkey FOREIGN KEY (customer_id, tenant_id)
        REFERENCES customers (id, tenant_id);
