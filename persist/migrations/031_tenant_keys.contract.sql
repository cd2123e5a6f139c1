-- 031_tenant_keys (contract): the keys without tenant_id go (issue 30 item
-- 2). Run only once no node of a release before 031 runs: those nodes'
-- ON CONFLICT (id) statements need the unique indexes dropped here
-- (docs/decisions.md "Tenant keys: expand now, contract later").
-- `creditd migrate contract` applies it; a fresh database gets it at once.
--
-- Each primary key becomes the (..., tenant_id) index the expand built,
-- under the old name; the foreign keys that point at these keys already
-- use those indexes, so they stay.
ALTER TABLE customers DROP CONSTRAINT customers_pkey,
    ADD CONSTRAINT customers_pkey PRIMARY KEY USING INDEX customers_tenant_pkey;
ALTER TABLE credit_accounts DROP CONSTRAINT credit_accounts_pkey,
    ADD CONSTRAINT credit_accounts_pkey PRIMARY KEY USING INDEX credit_accounts_tenant_pkey;
ALTER TABLE credit_blocks DROP CONSTRAINT credit_blocks_pkey,
    ADD CONSTRAINT credit_blocks_pkey PRIMARY KEY USING INDEX credit_blocks_tenant_pkey;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_pkey,
    ADD CONSTRAINT ledger_entries_pkey PRIMARY KEY USING INDEX ledger_entries_tenant_pkey;
ALTER TABLE billable_metrics DROP CONSTRAINT billable_metrics_pkey,
    ADD CONSTRAINT billable_metrics_pkey PRIMARY KEY USING INDEX billable_metrics_tenant_pkey;
ALTER TABLE metering_rules DROP CONSTRAINT metering_rules_pkey,
    ADD CONSTRAINT metering_rules_pkey PRIMARY KEY USING INDEX metering_rules_tenant_pkey;
ALTER TABLE reservations DROP CONSTRAINT reservations_pkey,
    ADD CONSTRAINT reservations_pkey PRIMARY KEY USING INDEX reservations_tenant_pkey;
ALTER TABLE gauges DROP CONSTRAINT gauges_pkey,
    ADD CONSTRAINT gauges_pkey PRIMARY KEY USING INDEX gauges_tenant_pkey;
ALTER TABLE webhook_events DROP CONSTRAINT webhook_events_pkey,
    ADD CONSTRAINT webhook_events_pkey PRIMARY KEY USING INDEX webhook_events_tenant_pkey;
ALTER TABLE plans DROP CONSTRAINT plans_pkey,
    ADD CONSTRAINT plans_pkey PRIMARY KEY USING INDEX plans_tenant_pkey;
ALTER TABLE plan_variants DROP CONSTRAINT plan_variants_pkey,
    ADD CONSTRAINT plan_variants_pkey PRIMARY KEY USING INDEX plan_variants_tenant_pkey;
ALTER TABLE plan_grants DROP CONSTRAINT plan_grants_pkey,
    ADD CONSTRAINT plan_grants_pkey PRIMARY KEY USING INDEX plan_grants_tenant_pkey;
ALTER TABLE variant_entitlements DROP CONSTRAINT variant_entitlements_pkey,
    ADD CONSTRAINT variant_entitlements_pkey PRIMARY KEY USING INDEX variant_entitlements_tenant_pkey;
ALTER TABLE subscriptions DROP CONSTRAINT subscriptions_pkey,
    ADD CONSTRAINT subscriptions_pkey PRIMARY KEY USING INDEX subscriptions_tenant_pkey;
ALTER TABLE subscription_overrides DROP CONSTRAINT subscription_overrides_pkey,
    ADD CONSTRAINT subscription_overrides_pkey PRIMARY KEY USING INDEX subscription_overrides_tenant_pkey;
ALTER TABLE gauge_leases DROP CONSTRAINT gauge_leases_pkey,
    ADD CONSTRAINT gauge_leases_pkey PRIMARY KEY USING INDEX gauge_leases_tenant_pkey;
ALTER TABLE credit_alert_states DROP CONSTRAINT credit_alert_states_pkey,
    ADD CONSTRAINT credit_alert_states_pkey PRIMARY KEY USING INDEX credit_alert_states_tenant_pkey;
ALTER TABLE usage_hourly DROP CONSTRAINT usage_hourly_pkey,
    ADD CONSTRAINT usage_hourly_pkey PRIMARY KEY USING INDEX usage_hourly_tenant_pkey;

ALTER TABLE variant_entitlements DROP CONSTRAINT variant_entitlements_key;
ALTER TABLE variant_entitlements RENAME CONSTRAINT variant_entitlements_key_t TO variant_entitlements_key;
DROP INDEX subscriptions_one_live;
ALTER INDEX subscriptions_one_live_t RENAME TO subscriptions_one_live;
DROP INDEX subscription_overrides_one_per_metric;
ALTER INDEX subscription_overrides_one_per_metric_t RENAME TO subscription_overrides_one_per_metric;
DROP INDEX credit_alert_settings_customer;
ALTER INDEX credit_alert_settings_customer_t RENAME TO credit_alert_settings_customer;

-- Every node now writes a delivery's tenant itself: the rows the previous
-- release wrote got theirs from the trigger, which goes.
DROP TRIGGER webhook_deliveries_tenant ON webhook_deliveries;
DROP FUNCTION webhook_deliveries_tenant();
UPDATE webhook_deliveries d SET tenant_id = e.tenant_id
FROM webhook_events e WHERE e.id = d.event_id AND d.tenant_id IS NULL;
ALTER TABLE webhook_deliveries ALTER COLUMN tenant_id SET NOT NULL,
    DROP CONSTRAINT webhook_deliveries_pkey,
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY USING INDEX webhook_deliveries_tenant_pkey;
