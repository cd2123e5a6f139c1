-- 021_reservation_items: multi-metric reservations (issue 15 item 3). A
-- hold of several metrics stores billable_metric_key '' and its totals in
-- estimated_units, estimated_cost, actual_units and actual_cost; items
-- lists each metric: [{billable_metric_key, estimated_units,
-- estimated_cost, actual_units, actual_cost}] (actual members null until
-- the commit). NULL for a single-metric hold. Redis does not keep the list:
-- a commit reads it here.
ALTER TABLE reservations ADD COLUMN items JSONB;
