package lua

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// movingClock is a clock a test sets.
type movingClock struct{ ms atomic.Int64 }

func (c *movingClock) Now() time.Time { return time.UnixMilli(c.ms.Load()).UTC() }
func (c *movingClock) at(d time.Duration) time.Time {
	c.ms.Store(t0.Add(d).UnixMilli())
	return c.Now()
}

// TestGaugeLeases: a leased increment's slots count until the lease ends;
// a read past its expires no longer counts them before any script wrote
// the lapse; renew moves the expiry, release returns the slots at once,
// the sweep's expire writes the lapse only once due; a decrement cannot
// free leased slots; a refusal changes nothing; retries replay.
func TestGaugeLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		clk := &movingClock{}
		b.store.WithClock(clk)
		c := newCustomer()
		b.known(t, c)
		gauge := func(now time.Time, delta int64, lease uuid.UUID, secs int64) (engine.MutationResult, error) {
			return b.store.Gauge(ctx, engine.GaugeCommand{
				CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, Metric: "seats",
				Delta: delta, Cap: 10, LeaseID: lease, LeaseSeconds: secs})
		}
		lease := func(now time.Time, id uuid.UUID, action engine.LeaseAction, secs int64, idem string) (engine.MutationResult, error) {
			return b.store.Lease(ctx, engine.LeaseCommand{
				CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, IdempotencyKey: idem, RequestHash: "h-" + idem, Now: now}, Metric: "seats",
				LeaseID: id, Action: action, Seconds: secs})
		}
		value := func(d time.Duration, want int64) {
			t.Helper()
			clk.at(d)
			if v, err := b.store.GaugeValue(ctx, c, "seats"); err != nil || v != want {
				t.Errorf("value at +%v: %d %v, want %d", d, v, err, want)
			}
		}
		l1, l2, l3 := uuid.New(), uuid.New(), uuid.New()
		res, err := gauge(clk.at(0), 3, l1, 60)
		if err != nil || res.Mutation.Gauge.Current != 3 || len(res.Mutation.Gauge.Leases) != 1 {
			t.Fatalf("leased increment: %v %+v", err, res.Mutation.Gauge)
		}
		if l := res.Mutation.Gauge.Leases[0]; l.ID != l1 || l.Status != engine.LeaseActive || l.Amount != 3 ||
			l.ExpiresMS != t0.Add(time.Minute).UnixMilli() || l.Seconds != 60 {
			t.Errorf("opened lease %+v", l)
		}
		if _, err := gauge(clk.at(0), 2, uuid.Nil, 0); err != nil {
			t.Fatal(err)
		}
		before := b.dump(t, c)
		if _, err := gauge(clk.at(0), -3, uuid.Nil, 0); !errors.Is(err, engine.ErrGaugeLeased) {
			t.Errorf("decrement into leased slots: %v", err)
		}
		if b.dump(t, c) != before {
			t.Errorf("a refused decrement changed state")
		}
		if _, err := gauge(clk.at(0), -2, uuid.Nil, 0); err != nil {
			t.Errorf("decrement of the free slots: %v", err)
		}
		value(59*time.Second, 3)
		value(60*time.Second, 0) // exact at read time, nothing swept
		if _, err := lease(clk.at(30*time.Second), l1, engine.LeaseExpire, 0, ""); !errors.Is(err, engine.ErrLeaseNotDue) {
			t.Errorf("expire before due: %v", err)
		}
		res, err = lease(clk.at(30*time.Second), l1, engine.LeaseRenew, 120, "renew-1")
		if err != nil || len(res.Mutation.Gauge.Leases) != 1 || res.Mutation.Gauge.Leases[0].ExpiresMS != t0.Add(150*time.Second).UnixMilli() {
			t.Fatalf("renew: %v %+v", err, res.Mutation.Gauge)
		}
		again, err := lease(clk.at(40*time.Second), l1, engine.LeaseRenew, 120, "renew-1")
		if err != nil || !again.Replayed || again.Mutation.OpID != res.Mutation.OpID {
			t.Errorf("renew retry: %v %+v", err, again)
		}
		value(100*time.Second, 3)
		if _, err := gauge(clk.at(100*time.Second), 4, l2, 10); err != nil {
			t.Fatal(err)
		}
		before = b.dump(t, c)
		if _, err := gauge(clk.at(105*time.Second), 4, uuid.Nil, 0); err == nil {
			t.Errorf("increment past the cap while l2 holds its slots")
		}
		if b.dump(t, c) != before {
			t.Errorf("a refused increment changed state")
		}
		// l2 lapsed at +110 s: the cap sees 3 and the Mutation writes the lapse.
		res, err = gauge(clk.at(111*time.Second), 4, uuid.Nil, 0)
		if err != nil || res.Mutation.Gauge.Current != 7 || len(res.Mutation.Gauge.Leases) != 1 {
			t.Fatalf("increment after l2 lapsed: %v %+v", err, res.Mutation.Gauge)
		}
		if l := res.Mutation.Gauge.Leases[0]; l.ID != l2 || l.Status != engine.LeaseExpired || l.EndedMS == nil ||
			*l.EndedMS != t0.Add(110*time.Second).UnixMilli() {
			t.Errorf("lapsed lease %+v", l)
		}
		if _, err := lease(clk.at(112*time.Second), l2, engine.LeaseRenew, 0, ""); !errors.Is(err, engine.ErrLeaseNotFound) {
			t.Errorf("renew of a lapse written down: %v", err)
		}
		res, err = lease(clk.at(120*time.Second), l1, engine.LeaseRelease, 0, "")
		if err != nil || res.Mutation.Gauge.Current != 4 || res.Mutation.Gauge.Leases[0].Status != engine.LeaseReleased {
			t.Errorf("release: %v %+v", err, res.Mutation.Gauge)
		}
		if _, err := lease(clk.at(121*time.Second), l1, engine.LeaseRelease, 0, ""); !errors.Is(err, engine.ErrLeaseNotFound) {
			t.Errorf("second release: %v", err)
		}
		// The sweep's expire writes the lapse once due, then finds nothing.
		if _, err := gauge(clk.at(200*time.Second), 1, l3, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := lease(clk.at(200*time.Second), l3, engine.LeaseRenew, 0, ""); err != nil {
			t.Errorf("renew with the lease's own length: %v", err)
		}
		res, err = lease(clk.at(202*time.Second), l3, engine.LeaseExpire, 0, "")
		if err != nil || res.Mutation.Gauge.Current != 4 || res.Mutation.Gauge.Leases[0].Status != engine.LeaseExpired ||
			*res.Mutation.Gauge.Leases[0].EndedMS != t0.Add(201*time.Second).UnixMilli() {
			t.Errorf("expire: %v %+v", err, res.Mutation.Gauge)
		}
		if b.rdb.HExists(ctx, b.store.accountKey(c.CustomerID), "L:seats").Val() {
			t.Errorf("the lease field outlived the last lease")
		}
		if _, err := lease(clk.at(203*time.Second), l3, engine.LeaseExpire, 0, ""); !errors.Is(err, engine.ErrLeaseNotFound) {
			t.Errorf("second expire: %v", err)
		}
	})
}

// TestGaugeLeaseBound: a gauge holds at most engine.MaxGaugeLeases active
// leases; the next leased increment is refused and changes nothing.
func TestGaugeLeaseBound(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		cmd := func() engine.GaugeCommand {
			return engine.GaugeCommand{
				CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0}, Metric: "jobs", Delta: 1, Cap: 0,
				Allow: true, LeaseID: uuid.New(), LeaseSeconds: 60}
		}
		for i := range engine.MaxGaugeLeases {
			if _, err := b.store.Gauge(ctx, cmd()); err != nil {
				t.Fatalf("lease %d: %v", i, err)
			}
		}
		before := b.dump(t, c)
		if _, err := b.store.Gauge(ctx, cmd()); !errors.Is(err, engine.ErrTooManyLeases) {
			t.Errorf("lease past the bound: %v", err)
		}
		if b.dump(t, c) != before {
			t.Errorf("the refusal changed state")
		}
	})
}

// TestLoadRestoresLeases: a rebuilt customer gets its active leases (the
// released ones stay in Postgres): their slots count until they end, a
// lease past its expires counts for nothing at once, and release works.
func TestLoadRestoresLeases(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		clk := &movingClock{}
		b.store.WithClock(clk)
		c := newCustomer()
		live, lapsed, gone := uuid.New(), uuid.New(), uuid.New()
		lease := func(id uuid.UUID, amount int64, exp time.Duration, st engine.LeaseStatus) engine.StoredLease {
			return engine.StoredLease{Metric: "seats", MutationLease: engine.MutationLease{ID: id, Amount: amount,
				Status: st, ExpiresMS: t0.Add(exp).UnixMilli(), CreatedMS: t0.UnixMilli() - 1, Seconds: 3600}}
		}
		b.load(t, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: "acct", Version: 4, UpdatedAtMS: t0.UnixMilli() - 1, Gauges: map[string]int64{"seats": 5},
			Leases: []engine.StoredLease{lease(live, 2, time.Hour, engine.LeaseActive),
				lease(lapsed, 1, -time.Minute, engine.LeaseActive), lease(gone, 9, time.Hour, engine.LeaseReleased)}})
		clk.at(0)
		if v, err := b.store.GaugeValue(ctx, c, "seats"); err != nil || v != 4 {
			t.Errorf("after load: %d %v, want 4 (the lapsed lease's slot returned)", v, err)
		}
		clk.at(2 * time.Hour)
		if v, _ := b.store.GaugeValue(ctx, c, "seats"); v != 2 {
			t.Errorf("past the live lease: %d, want 2", v)
		}
		res, err := b.store.Lease(ctx, engine.LeaseCommand{
			CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0}, Metric: "seats",
			LeaseID: live, Action: engine.LeaseRelease})
		if err != nil || res.Mutation.Gauge.Current != 2 || len(res.Mutation.Gauge.Leases) != 2 {
			t.Errorf("release after load: %v %+v", err, res.Mutation.Gauge)
		}
		if _, err := b.store.Lease(ctx, engine.LeaseCommand{
			CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0}, Metric: "seats",
			LeaseID: gone, Action: engine.LeaseRelease}); !errors.Is(err, engine.ErrLeaseNotFound) {
			t.Errorf("a released lease came back with the load: %v", err)
		}
	})
}
