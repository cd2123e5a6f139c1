package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Leased gauges (issue 15): a gauge increment may take a lease on the
// slots it adds. The slots return by themselves when the lease ends unless
// it is renewed, or at once when it is released, so a caller that dies
// never leaks a slot. Redis holds a gauge's active leases next to its
// count (lua: prelude "Gauge leases"); every script and read lapses those
// past their expires at once, the LeaseSweeper writes the lapse down for
// gauges nobody touches, and Postgres keeps every lease (a rebuild
// restores the active ones).

// MaxLeaseSeconds is the longest a lease is taken or renewed for.
const MaxLeaseSeconds = 86400

// MaxGaugeLeases is how many active leases one gauge of one customer holds
// at most (lua/prelude/gauges.lua MAX_GAUGE_LEASES; an increment past it is refused).
const MaxGaugeLeases = 200

// LeaseStatus is where a lease stands.
type LeaseStatus string

// Lease statuses.
const (
	LeaseActive   LeaseStatus = "active"
	LeaseReleased LeaseStatus = "released"
	LeaseExpired  LeaseStatus = "expired"
)

// MutationLease is one lease of a gauge as a Mutation carries it (the
// gauge section names the metric).
type MutationLease struct {
	ID     uuid.UUID   `json:"id"`
	Amount int64       `json:"amount"`
	Status LeaseStatus `json:"status"`
	// ExpiresMS is when the slots return unless renewed (Unix ms).
	ExpiresMS int64 `json:"expires"`
	CreatedMS int64 `json:"created"`
	// Seconds is the length it was last taken or renewed for: a renew
	// without lease_seconds extends by it again.
	Seconds int64 `json:"seconds"`
	// EndedMS is when it was released, or its expires once it lapsed.
	EndedMS *int64 `json:"ended,omitempty"`
}

// StoredLease is a lease with its gauge's metric key: a rebuild's and the
// look-up's form.
type StoredLease struct {
	Metric string
	MutationLease
}

// LeaseAction is what a LeaseCommand does.
type LeaseAction string

// Lease actions.
const (
	LeaseRenew   LeaseAction = "renew"
	LeaseRelease LeaseAction = "release"
	// LeaseExpire writes down the lapse of a lease past its expires (the sweep).
	LeaseExpire LeaseAction = "expire"
)

// LeaseCommand renews, releases or expires one lease of a gauge.
type LeaseCommand struct {
	CommandHeader
	Metric  string
	LeaseID uuid.UUID
	Action  LeaseAction
	// Seconds is a renew's new length; 0 keeps the lease's own.
	Seconds int64
	Context MutationContext
}

// Errors of the lease operations.
var (
	// ErrLeaseNotFound: no lease of that id on the customer's gauge.
	ErrLeaseNotFound = &Error{Kind: KindNotFound, Detail: "lease not found"}
	// ErrLeaseEnded: a renew of a lease that was released or lapsed; its
	// slots have returned, so the caller takes a new one.
	ErrLeaseEnded = &Error{Kind: KindConflict, Detail: "the lease ended and its slots returned; take a new lease"}
	// ErrLeaseNotDue: the sweep's expire of a lease not past its expires.
	ErrLeaseNotDue = &Error{Kind: KindConflict, Detail: "the lease is not due to expire"}
	// ErrGaugeLeased: a decrement below the slots active leases hold.
	ErrGaugeLeased = &Error{Kind: KindConflict, Field: "amount",
		Detail: "the decrement would free slots that active leases hold; release the leases instead"}
	// ErrTooManyLeases: an increment's lease past MaxGaugeLeases.
	ErrTooManyLeases = &Error{Kind: KindConflict, Field: "lease_seconds",
		Detail: "the gauge holds the most active leases it may (200)"}
)

// DueLease is an active lease past its expires, as Postgres lists it.
type DueLease struct {
	Customer CustomerKey
	Metric   string
	LeaseID  uuid.UUID
}

// Lease is the API view of a gauge lease.
type Lease struct {
	ID        uuid.UUID   `json:"id"`
	Amount    int64       `json:"amount"`
	Status    LeaseStatus `json:"status"`
	ExpiresAt time.Time   `json:"expires_at"`
}

// LeaseRenewal is a checked lease renew: Seconds is the new length, 0 for
// the lease's own.
type LeaseRenewal struct {
	Seconds int64
}

// leaseView is l as the API shows it.
func leaseView(l MutationLease) *Lease {
	return &Lease{ID: l.ID, Amount: l.Amount, Status: l.Status, ExpiresAt: time.UnixMilli(l.ExpiresMS).UTC()}
}

// CheckLeaseSeconds checks lease_seconds (422 naming the field).
func CheckLeaseSeconds(v int64) error {
	if v < 1 || v > MaxLeaseSeconds {
		return Invalid("lease_seconds", "lease_seconds must be an integer from 1 to 86400")
	}
	return nil
}

// leaseOf is the lease id among those a Mutation carries (nil when absent).
func leaseOf(m Mutation, id uuid.UUID) *MutationLease {
	if m.Gauge == nil {
		return nil
	}
	for i := range m.Gauge.Leases {
		if m.Gauge.Leases[i].ID == id {
			return &m.Gauge.Leases[i]
		}
	}
	return nil
}

// RenewLease extends lease id of the customer's gauge metricKey to now
// plus in.Seconds (the lease's own length when 0). Errors: 400 (not a
// gauge), 404 (metric, customer or lease), 409 (the lease ended).
func (s *Entitlements) RenewLease(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, id uuid.UUID, idem Idempotency, in LeaseRenewal) (GaugeResult, error) {
	return s.leaseOp(ctx, scope, tenant, ref, metricKey, id, idem, LeaseRenew, in.Seconds)
}

// ReleaseLease returns the slots of lease id of the customer's gauge
// metricKey now. Releasing a lease that already ended changes nothing and
// answers 200 with its final status (released or expired): a retry of a
// release always succeeds. Errors: 400 (not a gauge), 404 (metric,
// customer or lease).
func (s *Entitlements) ReleaseLease(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, id uuid.UUID, idem Idempotency) (GaugeResult, error) {
	return s.leaseOp(ctx, scope, tenant, ref, metricKey, id, idem, LeaseRelease, 0)
}

// leaseOp runs one renew or release and answers with the gauge and the lease.
func (s *Entitlements) leaseOp(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, id uuid.UUID, idem Idempotency, action LeaseAction, secs int64) (GaugeResult, error) {
	if s.leases == nil || s.leaseIndex == nil {
		return GaugeResult{}, errors.New("engine: leases are not wired")
	}
	m, err := s.gaugeMetric(ctx, scope, metricKey)
	if err != nil {
		return GaugeResult{}, err
	}
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return GaugeResult{}, err
	}
	f, err := s.facts(ctx, c)
	if err != nil {
		return GaugeResult{}, err
	}
	capMC := gaugeCap(value(f, m))
	key := CustomerKeyOf(c)
	cmd := LeaseCommand{
		CommandHeader: headerOf(key, idem, s.clock.Now()), Metric: metricKey, LeaseID: id, Action: action,
		Seconds: secs, Context: contextOf(c, tenant)}
	res, err := withLoad(ctx, s.credits, key, func() (MutationResult, error) { return s.leases.Lease(ctx, cmd) })
	if errors.Is(err, ErrLeaseNotFound) {
		return s.endedLease(ctx, key, metricKey, id, action, capMC, cmd.Now)
	}
	if err != nil {
		return GaugeResult{}, err
	}
	out := gaugeResult(metricKey, res.Mutation, capMC)
	if l := leaseOf(res.Mutation, id); l != nil {
		out.Lease = leaseView(*l)
	}
	return out, nil
}

// endedLease answers for a lease Redis no longer reservations: Postgres says
// whether it ever was. A release of it is 200 with its final status; a
// renew is 409. Postgres trails Redis: the look-up waits (bounded) until
// it holds the account version Redis shows, so a release retried at once
// finds the lease its first try ended; a lease it still calls active has
// ended in Redis all the same: expired when past its expires, else
// released.
func (s *Entitlements) endedLease(ctx context.Context, key CustomerKey, metricKey string, id uuid.UUID, action LeaseAction, capMC int64, now time.Time) (GaugeResult, error) {
	s.credits.awaitPersisted(ctx, key)
	rec, ok, err := s.leaseIndex.LeaseOf(ctx, key, id)
	if err != nil {
		return GaugeResult{}, err
	}
	if !ok || rec.Metric != metricKey {
		return GaugeResult{}, ErrLeaseNotFound
	}
	if action != LeaseRelease {
		return GaugeResult{}, ErrLeaseEnded
	}
	if rec.Status == LeaseActive {
		rec.Status = LeaseReleased
		if rec.ExpiresMS <= now.UnixMilli() {
			rec.Status = LeaseExpired
		}
	}
	cur, err := s.hot.GaugeValue(ctx, key, metricKey)
	if errors.Is(err, ErrStateMissing) {
		if err = s.credits.Load(ctx, key); err == nil {
			cur, err = s.hot.GaugeValue(ctx, key, metricKey)
		}
	}
	if err != nil {
		return GaugeResult{}, err
	}
	return GaugeResult{BillableMetricKey: metricKey, Current: cur, Cap: capMC, Allowed: cur <= capMC,
		Headroom: capMC - cur, Lease: leaseView(rec.MutationLease)}, nil
}

// gaugeResult is the 200 body of a gauge operation from its Mutation.
func gaugeResult(metricKey string, m Mutation, capMC int64) GaugeResult {
	var cur int64
	if g := m.Gauge; g != nil {
		cur = g.Current
	}
	return GaugeResult{BillableMetricKey: metricKey, Current: cur, Cap: capMC, Allowed: cur <= capMC, Headroom: capMC - cur}
}
