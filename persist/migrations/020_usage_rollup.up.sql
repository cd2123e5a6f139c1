-- 020_usage_rollup: usage analytics (issue 15 item 5) read an hourly rollup
-- of the consumption entries instead of the ledger, so a month of a
-- customer with 10M ledger rows is at most 744 rows per metric. The
-- persister adds to it in the transaction that inserts the entries
-- (persist/usage.go), counting only the entries that transaction inserted,
-- so a replayed batch adds nothing.
--
-- One row per customer, UTC hour and metric: units and cost (millicredits,
-- the priced cost: what was charged plus the overage) summed, count the
-- consumption entries (a multi-metric consume counts once per item). Sums
-- saturate at the int64 maximum instead of failing the persister's
-- transaction (invariant 12). Like ledger_entries it has no foreign keys:
-- only the persister writes it.
CREATE TABLE usage_hourly (
    customer_id         UUID NOT NULL,
    hour_start          TIMESTAMPTZ NOT NULL,
    billable_metric_key TEXT NOT NULL,
    tenant_id           UUID NOT NULL,
    environment         TEXT NOT NULL,
    units               BIGINT NOT NULL,
    cost                BIGINT NOT NULL,
    count               BIGINT NOT NULL,
    PRIMARY KEY (customer_id, hour_start, billable_metric_key)
) WITH (fillfactor = 50);
-- fillfactor 50: a row of a busy hour is updated by every persister batch
-- that hour; the room left on its page keeps those updates HOT (no index
-- writes, old versions pruned on the page).

-- The tenant-wide read (GET /v1/usage) scans a tenant's hours; the
-- rollup's sums are not indexed, so the persister's updates stay HOT.
CREATE INDEX usage_hourly_tenant_idx ON usage_hourly (tenant_id, environment, hour_start);

-- Backfill from the ledger as it stands. The SHARE lock holds off
-- concurrent ledger inserts until this transaction commits, so no entry
-- is both missed here and written without its rollup by an older process.
LOCK TABLE ledger_entries IN SHARE MODE;

INSERT INTO usage_hourly
    (customer_id, hour_start, billable_metric_key, tenant_id, environment, units, cost, count)
SELECT customer_id, hour_start, metric, tenant_id, environment,
    LEAST(SUM(units), 9223372036854775807)::bigint,
    LEAST(SUM(cost), 9223372036854775807)::bigint,
    COUNT(*)
FROM (
    -- A single-metric consume, a usage event or a reservation commit: the
    -- metric and units on the entry; the cost is what it drew plus the
    -- overage.
    SELECT customer_id, date_trunc('hour', created_at, 'UTC') AS hour_start,
        billable_metric_key AS metric, tenant_id, environment,
        COALESCE(cost_units, 0)::numeric AS units, overage_mc::numeric - delta AS cost
    FROM ledger_entries
    WHERE type = 'consumption' AND billable_metric_key IS NOT NULL
    UNION ALL
    -- A multi-metric consume: one entry, its items in metadata.items.
    SELECT e.customer_id, date_trunc('hour', e.created_at, 'UTC'),
        i.item->>'billable_metric_key', e.tenant_id, e.environment,
        (i.item->>'units')::numeric, (i.item->>'cost')::numeric
    FROM ledger_entries e
        CROSS JOIN LATERAL jsonb_array_elements(e.metadata->'items') AS i(item)
    WHERE e.type = 'consumption' AND e.billable_metric_key IS NULL
        AND jsonb_typeof(e.metadata->'items') = 'array'
) consumption
GROUP BY customer_id, hour_start, metric, tenant_id, environment;
