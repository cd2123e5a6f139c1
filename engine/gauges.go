// Gauges: moving a gauge metric (seats, concurrent jobs) up or down within
// its entitlement cap.

package engine

import (
	"context"
	"errors"

	"github.com/google/uuid"
)

// GaugeMove is a checked gauge increment or decrement.
type GaugeMove struct {
	// Amount is how many slots move, >= 1.
	Amount int64
	// Allow lets an increment pass the cap (policy allow).
	Allow bool
	// LeaseSeconds takes a lease on an increment's slots (leases.go); 0
	// takes none.
	LeaseSeconds int64
}

// GaugeResult is the 200 body of a gauge operation.
type GaugeResult struct {
	BillableMetricKey string `json:"billable_metric_key"`
	Current           int64  `json:"current"`
	Cap               int64  `json:"cap"`
	Allowed           bool   `json:"allowed"`
	Headroom          int64  `json:"headroom"`
	// Lease is the lease the operation took, renewed or ended, if any.
	Lease *Lease `json:"lease,omitempty"`
}

// MoveGauge increments (up) or decrements a gauge. Errors: 400 (amount,
// policy, not a gauge, cross-tenant id), 404 (no such metric), 409 (cap
// under block, below zero).
func (s *Entitlements) MoveGauge(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, up bool, idem Idempotency, in GaugeMove) (GaugeResult, error) {
	m, err := s.gaugeMetric(ctx, scope, metricKey)
	if err != nil {
		return GaugeResult{}, err
	}
	c, err := s.customers.Resolve(ctx, scope, ref, !ref.Strict)
	if err != nil {
		return GaugeResult{}, err
	}
	delta := in.Amount
	if !up {
		delta = -delta
	}
	f, err := s.facts(ctx, c)
	if err != nil {
		return GaugeResult{}, err
	}
	capMC := gaugeCap(value(f, m))
	cmd := GaugeCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, s.clock.Now()), Metric: metricKey, Delta: delta, Cap: capMC,
		Allow: in.Allow, Context: contextOf(c, tenant)}
	if in.LeaseSeconds != 0 {
		cmd.LeaseID, cmd.LeaseSeconds = uuid.Must(uuid.NewV7()), in.LeaseSeconds
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.hot.Gauge(ctx, cmd) })
	if errors.Is(err, ErrOverflow) {
		// The count plus amount passes int64: the amount's fault, a 400 like
		// the gauge's other amount errors.
		return GaugeResult{}, BadRequest("amount", "amount is too large: the gauge count would overflow a 64-bit integer")
	}
	if err != nil {
		return GaugeResult{}, err
	}
	// A retry re-runs into the op key and answers the first move's
	// figures: its cap too, whatever the plan or override says now.
	if g := res.Mutation.Gauge; g != nil && g.Cap != nil {
		capMC = *g.Cap
	}
	out := gaugeResult(metricKey, res.Mutation, capMC)
	if g := res.Mutation.Gauge; g != nil && in.LeaseSeconds != 0 {
		// The lease this increment opened (a replay's is the original's):
		// the one active lease of the Mutation; the others lapsed.
		for _, l := range g.Leases {
			if l.Status == LeaseActive {
				out.Lease = leaseView(l)
			}
		}
	}
	return out, nil
}

// gaugeMetric is the gauge metric metricKey names: 404 when there is none,
// 400 when it is not a gauge.
func (s *Entitlements) gaugeMetric(ctx context.Context, scope Scope, metricKey string) (BillableMetric, error) {
	m, ok, err := s.metering.Metric(ctx, scope, metricKey)
	if err != nil {
		return BillableMetric{}, err
	}
	if !ok {
		return BillableMetric{}, NotFound("billable metric not found")
	}
	if m.Type != MetricGauge {
		return BillableMetric{}, BadRequest("billable_metric_key", "the metric is not a gauge")
	}
	return m, nil
}
