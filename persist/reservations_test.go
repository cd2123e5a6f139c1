package persist

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// reserve is a reservation of est millicredits on metric, as the reserve script
// would write it.
func (a *account) reserve(idem string, metric string, est int64, ttl time.Duration) (engine.Mutation, engine.MutationReservation) {
	ref := uuid.New()
	m := a.mutation(engine.MutationReserve, idem, []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryReservation, Ref: &ref}})
	h := engine.MutationReservation{ID: ref, Metric: metric, EstimatedUnits: est / 10, EstimatedCost: est,
		Status: engine.ReservationActive, ExpiresMS: a.at.Add(ttl).UnixMilli(), CreatedMS: a.at.UnixMilli(),
		Metadata: json.RawMessage(`{"job":"j1"}`)}
	m.Account.Reserved += est
	m.Reservation = &h
	return m, h
}

// finish commits (actual >= 0) or releases/expires h.
func (a *account) finish(h engine.MutationReservation, status engine.ReservationStatus, actual int64) engine.Mutation {
	kind := engine.MutationRelease
	if status == engine.ReservationCommitted {
		kind = engine.MutationCommit
	}
	m := a.mutation(kind, "", []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryRelease, Ref: &h.ID}})
	at := a.at.UnixMilli()
	h.Status = status
	h.Released = h.EstimatedCost
	if status == engine.ReservationCommitted {
		units, cost := actual/10, actual
		h.ActualUnits, h.ActualCost, h.CommittedMS = &units, &cost, &at
	} else {
		h.ReleasedMS = &at
	}
	m.Reservation = &h
	return m
}

// gauge sets counter metric to current.
func (a *account) gauge(metric string, current int64) engine.Mutation {
	m := a.mutation(engine.MutationGaugeKind, "", nil)
	m.Gauge = &engine.MutationGauge{Metric: metric, Current: current}
	return m
}

func (b *bundle) apply(t *testing.T, ms ...engine.Mutation) {
	t.Helper()
	if err := b.store.Apply(b.ctx, ms); err != nil {
		t.Fatal(err)
	}
}

// TestReservationsSection: the reservations row follows the newest version
// whatever order and however often Mutations arrive.
func TestReservationsSection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := newAccount(live, now)
	res, h := a.reserve("r1", "gpu", 500, time.Hour)
	commit := a.finish(h, engine.ReservationCommitted, 420)

	// The commit arrives first; the late reserve must not roll it back.
	b.apply(t, commit)
	b.apply(t, res)
	b.apply(t, res, commit, res)
	got, err := b.store.GetReservation(b.ctx, a.key.TenantID, h.ID)
	if err != nil {
		t.Fatal(err)
	}
	committedAt := time.UnixMilli(*commit.Reservation.CommittedMS).UTC()
	if got.Status != engine.ReservationCommitted || got.ActualUnits == nil || *got.ActualUnits != 42 ||
		got.ActualCost == nil || *got.ActualCost != 420 || got.CommittedAt == nil || !got.CommittedAt.Equal(committedAt) ||
		got.ReleasedAt != nil || got.EstimatedCost != 500 || got.EstimatedUnits != 50 || got.ReferenceID != h.ID ||
		got.CustomerID != a.key.CustomerID || got.TenantID != live.TenantID || got.Environment != engine.EnvironmentLive ||
		got.BillableMetricKey != "gpu" || string(got.Metadata["job"]) != `"j1"` ||
		!got.ExpiresAt.Equal(time.UnixMilli(h.ExpiresMS)) || !got.CreatedAt.Equal(time.UnixMilli(h.CreatedMS)) {
		t.Fatalf("reservation = %+v", got)
	}
	var version, released int64
	if err := b.pool.QueryRow(b.ctx, `SELECT version, released FROM reservations WHERE id = $1`, h.ID).Scan(&version, &released); err != nil {
		t.Fatal(err)
	}
	if version != commit.Account.Version || released != 500 || b.count(t, "reservations") != 1 {
		t.Fatalf("version %d released %d", version, released)
	}

	// Both in one batch, oldest last: the newest still wins.
	a2 := newAccount(live, now)
	res2, h2 := a2.reserve("r2", "gpu", 100, time.Minute)
	rel2 := a2.finish(h2, engine.ReservationExpired, 0)
	b.apply(t, rel2, res2)
	got2, err := b.store.GetReservation(b.ctx, a2.key.TenantID, h2.ID)
	if err != nil || got2.Status != engine.ReservationExpired || got2.ReleasedAt == nil || got2.CommittedAt != nil ||
		got2.ActualUnits != nil || len(got2.Metadata) != 1 {
		t.Fatalf("expired reservation = %+v, %v", got2, err)
	}
	if _, err := b.store.GetReservation(b.ctx, a2.key.TenantID, uuid.New()); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("unknown reservation: %v", err)
	}
	key, err := b.store.ReservationCustomer(b.ctx, a2.key.TenantID, h2.ID)
	if err != nil || key != a2.key {
		t.Fatalf("ReservationCustomer = %+v, %v (want %+v)", key, err, a2.key)
	}
	// Unknown, and another tenant's reservation: not found alike.
	for _, tc := range []struct{ tenant, id uuid.UUID }{{a2.key.TenantID, uuid.New()}, {uuid.New(), h2.ID}} {
		if _, err := b.store.ReservationCustomer(b.ctx, tc.tenant, tc.id); !errors.Is(err, engine.ErrNotFound) {
			t.Fatalf("reservation customer of %+v: %v, want ErrNotFound", tc, err)
		}
		if _, err := b.store.GetReservation(b.ctx, tc.tenant, tc.id); !errors.Is(err, engine.ErrNotFound) {
			t.Fatalf("reservation %+v: %v, want ErrNotFound", tc, err)
		}
	}
}

// TestGaugesSection: a gauge counter moves only forward in version.
func TestGaugesSection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g1, g2, g3 := a.gauge("seats", 1), a.gauge("seats", 2), a.gauge("seats", 1)
	other := a.gauge("projects", 7)

	b.apply(t, g3, g1)
	b.apply(t, g2)
	b.apply(t, g1, g2, other, g3, g2)
	rows, err := b.pool.Query(b.ctx, `SELECT metric_key, current, version, tenant_id FROM gauges WHERE customer_id = $1`, a.key.CustomerID)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	for rows.Next() {
		var metric string
		var current, version int64
		var tenant uuid.UUID
		if err := rows.Scan(&metric, &current, &version, &tenant); err != nil {
			t.Fatal(err)
		}
		if tenant != live.TenantID {
			t.Fatalf("tenant %s", tenant)
		}
		got[metric] = [2]int64{current, version}
	}
	if rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if len(got) != 2 || got["seats"] != [2]int64{1, g3.Account.Version} || got["projects"] != [2]int64{7, other.Account.Version} {
		t.Fatalf("gauges = %v", got)
	}
}

// TestApplyRefusedConsumeAndOverage: a refused consume (no entries, the
// version unchanged) is accepted and changes nothing; an allowed consume's
// overage reaches the overage sums.
func TestApplyRefusedConsumeAndOverage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := newAccount(live, now)
	g := a.grant("g", 100, nil)
	b.apply(t, g)

	refused := a.mutation(engine.MutationConsume, "refused-1", nil)
	a.version-- // a refusal does not move the account
	refused.Account.Version = a.version
	refused.Usage = &engine.MutationUsage{Metric: "api", Units: 5, Cost: 500, Refused: true}
	b.apply(t, refused)
	b.apply(t, refused)
	if v, bal := b.accountRow(t, a.key.CustomerID); v != 1 || bal != 100 {
		t.Fatalf("account after refusal: version %d balance %d", v, bal)
	}
	if n := b.count(t, "ledger_entries"); n != 1 {
		t.Fatalf("%d ledger entries", n)
	}

	block := firstBlock(a)
	allowed := a.consume("c", block, 100, "api", 400)
	allowed.Kind = engine.MutationConsume
	b.apply(t, allowed)
	lines, err := b.store.Overage(b.ctx, a.key, now.Add(-time.Hour), now.Add(time.Hour))
	if err != nil || len(lines) != 1 || lines[0].BillableMetricKey != "api" || lines[0].OverageMC != 400 {
		t.Fatalf("overage = %+v, %v", lines, err)
	}
}

func TestListReservations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := newAccount(live, now)
	stranger := newAccount(live, now)
	sres, _ := stranger.reserve("s", "gpu", 10, time.Hour)
	b.apply(t, sres)

	var ids []uuid.UUID // oldest first
	status := map[uuid.UUID]engine.ReservationStatus{}
	for i := range 7 {
		m, h := a.reserve("", "gpu", int64(10*(i+1)), time.Hour)
		b.apply(t, m)
		ids = append(ids, h.ID)
		status[h.ID] = engine.ReservationActive
		switch i % 3 {
		case 1:
			b.apply(t, a.finish(h, engine.ReservationCommitted, 5))
			status[h.ID] = engine.ReservationCommitted
		case 2:
			b.apply(t, a.finish(h, engine.ReservationReleased, 0))
			status[h.ID] = engine.ReservationReleased
		}
	}

	for _, filter := range []string{"", "active", "committed", "released", "expired"} {
		var want []uuid.UUID
		for i := len(ids) - 1; i >= 0; i-- {
			if filter == "" || string(status[ids[i]]) == filter {
				want = append(want, ids[i])
			}
		}
		var got []uuid.UUID
		cursor := ""
		for {
			page, err := b.store.ListReservations(b.ctx, a.key, filter, cursor, 2)
			if err != nil {
				t.Fatalf("%q: %v", filter, err)
			}
			if page.Data == nil {
				t.Fatalf("%q: nil data", filter)
			}
			for _, r := range page.Data {
				got = append(got, r.ID)
			}
			if !page.HasMore {
				break
			}
			cursor = page.NextCursor
		}
		if len(got) != len(want) {
			t.Fatalf("%q: got %v, want %v", filter, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%q: got %v, want %v", filter, got, want)
			}
		}
	}
	if _, err := b.store.ListReservations(b.ctx, a.key, "", "nope", 2); !errors.Is(err, errInvalidCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// TestAccountStateReservationsAndGauges: a rebuild gets the active reservations, those
// finalized within FinalizedReservationWindow, and every gauge counter.
func TestAccountStateReservationsAndGauges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	a := newAccount(live, now.Add(-72*time.Hour))

	b.apply(t, a.grant("g", 10000, nil))
	oldRes, oldH := a.reserve("", "gpu", 100, time.Hour)
	oldRel := a.finish(oldH, engine.ReservationReleased, 0) // 3 days ago: left out
	a.at = now.Add(-2 * time.Hour)
	recentRes, recentH := a.reserve("", "gpu", 200, time.Hour)
	recentCommit := a.finish(recentH, engine.ReservationCommitted, 150) // 2 h ago: loaded
	activeRes, activeH := a.reserve("hold", "gpu", 300, time.Hour)
	seats := a.gauge("seats", 3)
	b.apply(t, oldRes, oldRel, recentRes, recentCommit, activeRes, seats, a.gauge("projects", 0))

	s := newAccount(sandbox, now)
	b.apply(t, s.grant("", 5, nil))

	appliedSince := now.Add(-engine.AppliedRetention)
	st, ok, err := b.store.AccountState(b.ctx, a.key, appliedSince)
	if err != nil || !ok {
		t.Fatalf("AccountState: %v %v", ok, err)
	}
	if len(st.Reservations) != 2 || st.Reservations[0].ID != recentH.ID || st.Reservations[1].ID != activeH.ID {
		t.Fatalf("reservations = %+v", st.Reservations)
	}
	rc := st.Reservations[0]
	if rc.Status != engine.ReservationCommitted || rc.ActualCost == nil || *rc.ActualCost != 150 ||
		rc.CommittedMS == nil || *rc.CommittedMS != *recentCommit.Reservation.CommittedMS || rc.ReleasedMS != nil ||
		rc.Released != 200 || rc.Metric != "gpu" || rc.CreatedMS != recentH.CreatedMS || rc.ExpiresMS != recentH.ExpiresMS {
		t.Fatalf("committed reservation = %+v", rc)
	}
	ra := st.Reservations[1]
	wj, _ := json.Marshal(activeH)
	gj, _ := json.Marshal(ra)
	var wv, gv any
	_ = json.Unmarshal(wj, &wv)
	_ = json.Unmarshal(gj, &gv)
	if mustJSON(wv) != mustJSON(gv) {
		t.Fatalf("active reservation round trip:\n got %s\nwant %s", gj, wj)
	}
	if len(st.Gauges) != 2 || st.Gauges["seats"] != 3 || st.Gauges["projects"] != 0 {
		t.Fatalf("gauges = %v", st.Gauges)
	}

	states, err := b.store.AccountStates(b.ctx, uuid.Nil, 10, appliedSince)
	if err != nil || len(states) != 2 {
		t.Fatalf("AccountStates = %d, %v", len(states), err)
	}
	for _, st := range states {
		if st.CustomerID == s.key.CustomerID {
			if st.Reservations == nil || len(st.Reservations) != 0 || st.Gauges == nil || len(st.Gauges) != 0 {
				t.Fatalf("holdless account = %+v", st)
			}
			continue
		}
		if len(st.Reservations) != 2 || len(st.Gauges) != 2 {
			t.Fatalf("account %s: %d reservations, %d gauges", st.CustomerID, len(st.Reservations), len(st.Gauges))
		}
	}
}
