package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The usage rollup (migration 020, issue 15 item 5): every batch that
// inserts consumption entries adds them to usage_hourly in the same
// transaction, one row per customer, UTC hour and metric.
//
// Only entries the transaction inserted count. The lean write (copy.go)
// inserts every entry of its batch or fails on the first one already
// stored, so it adds the whole batch, summed in Go to one row per key.
// The ON CONFLICT write (a replay, a dead-letter retry) may skip entries;
// it adds only those its entry insert returned, in the same statement, so
// two Applies of one batch racing on two nodes add it once: the second
// one's insert waits for the first's commit and then returns nothing.

// usageSetSQL adds the incoming sums to a stored row, saturating at the
// int64 maximum (a sum that leaves int64 must not fail the batch,
// invariant 12).
const usageSetSQL = ` ON CONFLICT (customer_id, hour_start, billable_metric_key, tenant_id) DO UPDATE SET
	units = LEAST(u.units::numeric + EXCLUDED.units, 9223372036854775807)::bigint,
	cost = LEAST(u.cost::numeric + EXCLUDED.cost, 9223372036854775807)::bigint,
	count = LEAST(u.count::numeric + EXCLUDED.count, 9223372036854775807)::bigint`

// upsertUsageSQL adds a batch's rows, already summed per key and sorted
// by it (so racing writers lock rows in one order).
const upsertUsageSQL = `INSERT INTO usage_hourly AS u
	(customer_id, hour_start, billable_metric_key, tenant_id, environment, units, cost, count)
SELECT * FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::uuid[], $5::text[], $6::bigint[],
	$7::bigint[], $8::bigint[])` + usageSetSQL

// insertEntriesUsageSQL is insertEntriesSQL whose inserted ids select the
// entries' contributions ($25.. one row per entry and metric) to add.
var insertEntriesUsageSQL = `WITH inserted AS (` + insertEntriesSQL + ` RETURNING id)
INSERT INTO usage_hourly AS u
	(customer_id, hour_start, billable_metric_key, tenant_id, environment, units, cost, count)
SELECT c.customer, c.hour, c.metric, c.tenant, c.env,
	LEAST(SUM(c.units), 9223372036854775807)::bigint, LEAST(SUM(c.cost), 9223372036854775807)::bigint,
	COUNT(*)
FROM unnest($25::uuid[], $26::uuid[], $27::timestamptz[], $28::text[], $29::uuid[], $30::text[],
	$31::bigint[], $32::bigint[]) AS c(entry, customer, hour, metric, tenant, env, units, cost)
	JOIN inserted ON inserted.id = c.entry
GROUP BY c.customer, c.hour, c.metric, c.tenant, c.env
ORDER BY c.customer, c.hour, c.metric COLLATE "C"` + usageSetSQL

// usageItem is one metric's part of a consumption entry.
type usageItem struct {
	metric      string
	units, cost int64
}

// usageItemsOf is what consumption entry i of e adds to the rollup: its
// metric, units and priced cost (what it drew plus the overage); for a
// multi-metric consume (no metric on the entry) the items its metadata
// lists. Other entries add nothing.
func usageItemsOf(e *entryCols, i int, buf []usageItem) []usageItem {
	if e.typ[i] != string(engine.EntryConsumption) {
		return buf
	}
	if e.metric[i] != nil {
		var units int64
		if e.units[i] != nil {
			units = *e.units[i]
		}
		return append(buf, usageItem{metric: *e.metric[i], units: units, cost: satAdd(e.overage[i], negSat(e.delta[i]))})
	}
	// Only a multi-metric consume writes member "items" (Go refuses a
	// caller's own), so most entries skip the decode.
	if !strings.Contains(e.meta[i], `"items"`) {
		return buf
	}
	var doc struct {
		Items []engine.UsageItem `json:"items"`
	}
	if json.Unmarshal([]byte(e.meta[i]), &doc) != nil {
		return buf
	}
	for _, it := range doc.Items {
		buf = append(buf, usageItem{metric: it.Metric, units: it.Units, cost: it.Cost})
	}
	return buf
}

// usageKey is one rollup row's key.
type usageKey struct {
	customer uuid.UUID
	hour     int64 // Unix seconds of the UTC hour
	metric   string
}

// usageSums is one rollup row's sums.
type usageSums struct {
	tenant             uuid.UUID
	env                string
	units, cost, count int64
}

// usageColumns are rollup rows column by column, as both statements take them.
type usageColumns struct {
	entry, customer, tenant []uuid.UUID
	hour                    []time.Time
	metric, env             []string
	units, cost, count      []int64
}

// hourOf is the start of at's UTC hour.
func hourOf(at time.Time) time.Time { return at.UTC().Truncate(time.Hour) }

// queueUsageSummed queues the lean write's rollup: the entries of cols
// summed per key in Go, one upsert.
func queueUsageSummed(b *pgx.Batch, cols *applyColumns) {
	e := &cols.entries
	sums := map[usageKey]*usageSums{}
	var items []usageItem
	for i := range e.id {
		items = usageItemsOf(e, i, items[:0])
		for _, it := range items {
			k := usageKey{customer: e.customer[i], hour: hourOf(e.at[i]).Unix(), metric: it.metric}
			s, ok := sums[k]
			if !ok {
				s = &usageSums{tenant: e.tenant[i], env: e.env[i]}
				sums[k] = s
			}
			s.units, s.cost, s.count = satAdd(s.units, it.units), satAdd(s.cost, it.cost), satAdd(s.count, 1)
		}
	}
	if len(sums) == 0 {
		return
	}
	keys := make([]usageKey, 0, len(sums))
	for k := range sums {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].less(keys[j]) })
	var c usageColumns
	for _, k := range keys {
		s := sums[k]
		c.customer = append(c.customer, k.customer)
		c.hour = append(c.hour, time.Unix(k.hour, 0).UTC())
		c.metric = append(c.metric, k.metric)
		c.tenant = append(c.tenant, s.tenant)
		c.env = append(c.env, s.env)
		c.units = append(c.units, s.units)
		c.cost = append(c.cost, s.cost)
		c.count = append(c.count, s.count)
	}
	b.Queue(upsertUsageSQL, c.customer, c.hour, c.metric, c.tenant, c.env, c.units, c.cost, c.count)
}

// usageContributions are the rollup rows of cols's entries one per entry
// and metric, unsummed, for insertEntriesUsageSQL; ok is false when no
// entry adds to the rollup.
func usageContributions(cols *applyColumns) (c usageColumns, ok bool) {
	e := &cols.entries
	var items []usageItem
	for i := range e.id {
		items = usageItemsOf(e, i, items[:0])
		for _, it := range items {
			c.entry = append(c.entry, e.id[i])
			c.customer = append(c.customer, e.customer[i])
			c.hour = append(c.hour, hourOf(e.at[i]))
			c.metric = append(c.metric, it.metric)
			c.tenant = append(c.tenant, e.tenant[i])
			c.env = append(c.env, e.env[i])
			c.units = append(c.units, it.units)
			c.cost = append(c.cost, it.cost)
		}
	}
	return c, len(c.entry) > 0
}

// less orders keys as the statements lock rows: customer, hour, metric
// (bytewise, as COLLATE "C").
func (k usageKey) less(o usageKey) bool {
	if c := bytes.Compare(k.customer[:], o.customer[:]); c != 0 {
		return c < 0
	}
	if k.hour != o.hour {
		return k.hour < o.hour
	}
	return k.metric < o.metric
}

// satAdd is a + b, held at the int64 bounds instead of wrapping.
func satAdd(a, b int64) int64 {
	s := a + b
	switch {
	case a > 0 && b > 0 && s < 0:
		return math.MaxInt64
	case a < 0 && b < 0 && s >= 0:
		return math.MinInt64
	}
	return s
}

// negSat is -v, with -MinInt64 held at MaxInt64.
func negSat(v int64) int64 {
	if v == math.MinInt64 {
		return math.MaxInt64
	}
	return -v
}

// UsageRows sums the rollup's hours of q into its buckets, per metric
// (engine.UsageReader): sorted by metric key bytewise, then bucket start.
// Sums saturate at the int64 maximum.
func (s *Store) UsageRows(ctx context.Context, q engine.UsageQuery) ([]engine.UsageRow, error) {
	var sql strings.Builder
	sql.WriteString(`SELECT billable_metric_key, date_trunc($1, hour_start, 'UTC'),
		LEAST(SUM(units), 9223372036854775807)::bigint, LEAST(SUM(cost), 9223372036854775807)::bigint,
		LEAST(SUM(count), 9223372036854775807)::bigint
		FROM usage_hourly WHERE tenant_id = $4 AND hour_start >= $2 AND hour_start < $3`)
	args := []any{string(q.Granularity), q.From, q.To, q.TenantID}
	if q.CustomerID != nil {
		args = append(args, *q.CustomerID)
		sql.WriteString(` AND customer_id = $5`)
	} else {
		args = append(args, string(q.Environment))
		sql.WriteString(` AND environment = $5`)
	}
	if q.BillableMetricKey != nil {
		args = append(args, *q.BillableMetricKey)
		fmt.Fprintf(&sql, ` AND billable_metric_key = $%d`, len(args))
	}
	sql.WriteString(` GROUP BY 1, 2 ORDER BY billable_metric_key COLLATE "C", 2`)
	rows, err := s.pool.Query(ctx, sql.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("persist: usage rows: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.UsageRow, error) {
		var u engine.UsageRow
		err := r.Scan(&u.BillableMetricKey, &u.Start, &u.Units, &u.Cost, &u.Count)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: usage rows: %w", err)
	}
	return out, nil
}
