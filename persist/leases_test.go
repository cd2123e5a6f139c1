package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// leased moves gauge metric to current with the leases given.
func (a *account) leased(metric string, current int64, leases ...engine.MutationLease) engine.Mutation {
	m := a.gauge(metric, current)
	m.Gauge.Leases = leases
	return m
}

// TestGaugeLeasesSection: each lease row follows its newest version
// whatever order Mutations arrive in; the sweep lists the active leases
// past expires_at; LeaseOf finds a lease of its customer only; a rebuild
// gets the active leases alone.
func TestGaugeLeasesSection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := newAccount(live, now)
	lease := func(id uuid.UUID, st engine.LeaseStatus, exp time.Time) engine.MutationLease {
		l := engine.MutationLease{ID: id, Amount: 2, Status: st, ExpiresMS: exp.UnixMilli(), CreatedMS: now.UnixMilli(), Seconds: 60}
		if st != engine.LeaseActive {
			ended := exp.UnixMilli()
			l.EndedMS = &ended
		}
		return l
	}
	due, kept, released := uuid.New(), uuid.New(), uuid.New()
	open := a.leased("seats", 6, lease(due, engine.LeaseActive, now.Add(-time.Minute)),
		lease(kept, engine.LeaseActive, now.Add(time.Hour)), lease(released, engine.LeaseActive, now.Add(time.Hour)))
	renew := a.leased("seats", 6, lease(kept, engine.LeaseActive, now.Add(2*time.Hour)))
	end := a.leased("seats", 4, lease(released, engine.LeaseReleased, now))
	b.apply(t, end, open)
	b.apply(t, renew, open)

	list, err := b.store.DueLeases(b.ctx, now, 10)
	if err != nil || len(list) != 1 || list[0].LeaseID != due || list[0].Metric != "seats" || list[0].Customer != a.key {
		t.Fatalf("due leases %+v %v", list, err)
	}
	l, ok, err := b.store.LeaseOf(b.ctx, a.key, kept)
	if err != nil || !ok || l.Status != engine.LeaseActive || l.ExpiresMS != now.Add(2*time.Hour).UnixMilli() || l.Metric != "seats" {
		t.Fatalf("renewed lease %+v %v %v", l, ok, err)
	}
	if l, ok, _ := b.store.LeaseOf(b.ctx, a.key, released); !ok || l.Status != engine.LeaseReleased || l.EndedMS == nil {
		t.Fatalf("released lease %+v %v", l, ok)
	}
	other := a.key
	other.CustomerID = uuid.New()
	if _, ok, err := b.store.LeaseOf(b.ctx, other, kept); ok || err != nil {
		t.Fatalf("another customer's look-up found it: %v", err)
	}
	st, ok, err := b.store.AccountState(b.ctx, a.key, now.Add(-time.Hour))
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	got := map[uuid.UUID]bool{}
	for _, l := range st.Leases {
		got[l.ID] = l.Status == engine.LeaseActive && l.Metric == "seats"
	}
	if len(got) != 2 || !got[due] || !got[kept] || st.Gauges["seats"] != 4 {
		t.Fatalf("rebuild leases %+v gauges %v", st.Leases, st.Gauges)
	}
}
