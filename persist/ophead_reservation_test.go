package persist

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// reservationOps writes the Mutations of one customer's reservations as the
// scripts do (lua/reserve.lua, lua/commit.lua, lua/release.lua).
type reservationOps struct {
	c      *leanCustomer
	tenant uuid.UUID
	metric string
}

// next is the header of the customer's next keyed operation of kind.
func (o *reservationOps) next(kind engine.MutationKind) engine.Mutation {
	o.c.version++
	key := uuid.NewString()
	return engine.Mutation{OpID: uuid.Must(uuid.NewV7()), Kind: kind, TenantID: o.tenant, CustomerID: o.c.id,
		Environment: engine.EnvironmentLive, IdempotencyKey: key, RequestHash: requestHash(key), AtMS: time.Now().UnixMilli(),
		Account: engine.MutationAccount{ID: uuid.NewString(), Version: o.c.version, Balance: o.c.balance, Reserved: 700,
			Pending: 3, LifetimeEarned: 2_000_000},
		Context: &engine.MutationContext{ExternalID: o.c.ext, ThresholdMC: 1000, Policy: engine.OveragePolicyAllow}}
}

// reserve holds units at 10 a unit, with meta ("" for none).
func (o *reservationOps) reserve(units int64, meta string) engine.Mutation {
	m := o.next(engine.MutationReserve)
	id := uuid.Must(uuid.NewV7())
	metric := o.metric
	m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryReservation, Metric: &metric, Ref: &id}}
	m.Reservation = &engine.MutationReservation{ID: id, Metric: metric, EstimatedUnits: units, EstimatedCost: 10 * units,
		Status: engine.ReservationActive, ExpiresMS: m.AtMS + 600_000, CreatedMS: m.AtMS}
	if meta != "" {
		m.Reservation.Metadata = json.RawMessage(meta)
	}
	return m
}

// commit settles units of reservation r (its state after reserve or a
// partial commit) at 10 a unit, charged from the customer's block less
// overage; partial keeps it open.
func (o *reservationOps) commit(r engine.MutationReservation, units, overage int64, partial bool) engine.Mutation {
	m := o.next(engine.MutationCommit)
	cost := 10 * units
	charged := cost - overage
	o.c.balance -= charged
	m.Account.Balance = o.c.balance
	metric, id := o.metric, r.ID
	if units == 0 {
		m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryRelease, Metric: &metric, Ref: &id}}
	} else {
		rate := int64(10)
		e := engine.MutationEntry{Role: engine.RoleMain, Delta: -charged, Type: engine.EntryConsumption, Metric: &metric,
			Units: &units, Rate: &rate, Ref: &id, BlockID: &o.c.block}
		if overage > 0 {
			e.Overage = &overage
		}
		m.Entries = []engine.MutationEntry{e}
		m.Usage = &engine.MutationUsage{Metric: metric, Units: units, Cost: cost, Charged: charged, Overage: overage, ReservationID: &id}
		m.Blocks = []engine.MutationBlock{{ID: o.c.block, Original: 2_000_000, Remaining: o.c.balance, Source: "purchase",
			StartsMS: m.AtMS, CreatedMS: m.AtMS}}
	}
	settledUnits, settledCost := units, cost
	if r.ActualUnits != nil {
		settledUnits, settledCost = *r.ActualUnits+units, *r.ActualCost+cost
	}
	r.ActualUnits, r.ActualCost = &settledUnits, &settledCost
	if partial {
		r.Released += min(cost, r.EstimatedCost-r.Released)
	} else {
		at := m.AtMS
		r.Status, r.CommittedMS, r.Released = engine.ReservationCommitted, &at, r.EstimatedCost-r.Released
	}
	r.Metadata = json.RawMessage(`{"merged":true}`)
	m.Reservation = &r
	return m
}

// release returns what reservation r still holds (expire: the sweep's).
func (o *reservationOps) release(r engine.MutationReservation, expire bool) engine.Mutation {
	m := o.next(engine.MutationRelease)
	metric, id := o.metric, r.ID
	m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryRelease, Metric: &metric, Ref: &id}}
	at := m.AtMS
	r.Status, r.ReleasedMS, r.Released, r.Metadata = engine.ReservationReleased, &at, r.EstimatedCost-r.Released, nil
	if expire {
		r.Status = engine.ReservationExpired
	}
	m.Reservation = &r
	return m
}

// replayedOf is m as a lean replay rebuilds it: what its head and entry
// keep (ophead_reservation.go), nothing of what they leave out.
func replayedOf(m engine.Mutation) engine.Mutation {
	out := engine.Mutation{OpID: m.OpID, Kind: m.Kind, TenantID: m.TenantID, CustomerID: m.CustomerID,
		Environment: m.Environment, IdempotencyKey: m.IdempotencyKey, RequestHash: m.RequestHash, AtMS: m.AtMS,
		Account: engine.MutationAccount{Balance: m.Account.Balance, Reserved: m.Account.Reserved,
			Pending: m.Account.Pending, Version: m.Account.Version}}
	main := len(m.Entries) - 1
	out.Entries = make([]engine.MutationEntry, main+1)
	for i := range out.Entries[:main] {
		out.Entries[i] = engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry}
	}
	e := m.Entries[main]
	out.Entries[main] = engine.MutationEntry{Role: e.Role, Delta: e.Delta, Type: e.Type, Metric: e.Metric, Units: e.Units,
		Ref: e.Ref, Overage: e.Overage}
	if m.Usage != nil {
		u := *m.Usage
		out.Usage = &u
	}
	r := *m.Reservation
	switch m.Kind {
	case engine.MutationCommit:
		r.ExpiresMS, r.CreatedMS, r.Metadata = 0, 0, nil
	case engine.MutationRelease:
		r.ExpiresMS, r.CreatedMS, r.Metadata, r.ActualUnits, r.ActualCost = 0, 0, nil, nil, nil
	}
	out.Reservation = &r
	return out
}

// TestLeanReservationReplays (invariant 4): a reserve, a partial and a
// final commit, a commit of 0 units, a commit with overage, a release and
// an expiry recorded on their ledger entries (no operations row) are
// found by their keys through AppliedOps and the usage look-up alike, and
// rebuild every figure their heads and entries keep (replayedOf: a wrong
// field fails here); a reserve's metadata and request hash may hold the
// head's separator, and expiry entries may come before the main one.
// Reservation operations recorded whole (the release before this one, or
// CREDITD_FULL_RECORDS) still answer whole.
func TestLeanReservationReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	full := NewStore(b.pool).WithFullRecords(true)
	c := &leanCustomer{id: uuid.New(), block: uuid.New(), ext: "u-1", balance: 1_000_000}
	if err := b.store.Apply(b.ctx, []engine.Mutation{c.grant(live.TenantID)}); err != nil {
		t.Fatal(err)
	}
	o := &reservationOps{c: c, tenant: live.TenantID, metric: "tokens"}

	withMeta := o.reserve(40, `{"job":"a|b","n":7}`)
	withMeta.RequestHash = "reserve|hash"
	blk := uuid.New()
	withMeta.Entries = append([]engine.MutationEntry{
		{Role: engine.RoleExpiry, Delta: -5, Type: engine.EntryExpiry, BlockID: &blk}}, withMeta.Entries...)
	partial := o.commit(*withMeta.Reservation, 12, 0, true)
	final := o.commit(*partial.Reservation, 9, 0, false)
	plain := o.reserve(30, "")
	over := o.commit(*plain.Reservation, 50, 200, false)
	zero := o.reserve(5, "")
	zeroCommit := o.commit(*zero.Reservation, 0, 0, false)
	toRelease := o.reserve(20, "")
	release := o.release(*toRelease.Reservation, false)
	toExpire := o.reserve(20, "")
	expire := o.release(*toExpire.Reservation, true)
	lean := []engine.Mutation{withMeta, partial, final, plain, over, zero, zeroCommit, toRelease, release, toExpire, expire}
	for _, m := range lean {
		if _, _, ok := leanHead(&m); !ok {
			t.Fatalf("%s %s does not take the lean shape", m.Kind, m.IdempotencyKey)
		}
	}
	if err := b.store.Apply(b.ctx, lean); err != nil {
		t.Fatal(err)
	}
	oldReserve := o.reserve(7, `{"old":1}`)
	oldCommit := o.commit(*oldReserve.Reservation, 7, 0, false)
	old := []engine.Mutation{oldReserve, oldCommit}
	if err := full.Apply(b.ctx, old); err != nil {
		t.Fatal(err)
	}
	var ops, heads int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM operations WHERE customer_id = $1),
		(SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND op_head IS NOT NULL)`, c.id).Scan(&ops, &heads); err != nil {
		t.Fatal(err)
	}
	if ops != 3 || heads != len(lean) {
		t.Errorf("%d operations rows and %d op heads, want 3 (the grant, the whole reserve and commit) and %d", ops, heads, len(lean))
	}

	key := engine.CustomerKey{TenantID: live.TenantID, Environment: engine.EnvironmentLive, CustomerID: c.id}
	all := append(append([]engine.Mutation{}, lean...), old...)
	refs := make([]engine.OpRef, len(all))
	keys := make([]string, len(all))
	for i, m := range all {
		refs[i], keys[i] = engine.OpRef{Customer: key, Key: m.IdempotencyKey}, m.IdempotencyKey
	}
	got, found, err := NewAppliedBatcher(b.store).AppliedOps(b.ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	byKey, err := b.store.AppliedMutations(b.ctx, live.TenantID, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range all {
		want := replayedOf(m)
		if i >= len(lean) {
			// A whole record answers whole (its JSON's round trip).
			doc, err := engine.AppendMutationJSON(nil, &m)
			if err != nil {
				t.Fatal(err)
			}
			want = engine.Mutation{}
			if err := json.Unmarshal(doc, &want); err != nil {
				t.Fatal(err)
			}
		}
		if !found[i] {
			t.Errorf("%s %s: not found", m.Kind, m.IdempotencyKey)
			continue
		}
		if !reflect.DeepEqual(got[i], want) {
			t.Errorf("%s %s: AppliedOps answers\n%+v\nwant\n%+v", m.Kind, m.IdempotencyKey, got[i], want)
		}
		if g := byKey[m.IdempotencyKey]; i < len(lean) && !reflect.DeepEqual(g, want) {
			t.Errorf("%s %s: AppliedMutations answers\n%+v\nwant\n%+v", m.Kind, m.IdempotencyKey, g, want)
		}
	}
}

// TestReservationHeadRefuses: only a reserve, commit or release whose entry
// and head give back its answer's figures takes the lean shape; the others
// (a multi-metric reserve or commit, an extend, a refusal, a shape the
// scripts do not write) keep an operations row.
func TestReservationHeadRefuses(t *testing.T) {
	t.Parallel()
	o := &reservationOps{c: &leanCustomer{id: uuid.New(), block: uuid.New(), balance: 1_000_000}, tenant: uuid.New(), metric: "tokens"}
	items := []engine.ReservationItem{{BillableMetricKey: "tokens", EstimatedUnits: 1, EstimatedCost: 10}}
	for _, tc := range []struct {
		name   string
		op     func() engine.Mutation
		change func(m *engine.Mutation)
	}{
		{"reserve without a key", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) { m.IdempotencyKey = "" }},
		{"multi-metric reserve", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) {
			m.Reservation.Items, m.Reservation.Metric, m.Entries[0].Metric = items, "", nil
		}},
		{"extend (created before)", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) { m.Reservation.CreatedMS-- }},
		{"extend after a partial commit", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) { m.Reservation.Released = 10 }},
		{"reserve refused", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) {
			m.Usage = &engine.MutationUsage{Metric: "tokens", Units: 3, Cost: 30, Refused: true}
		}},
		{"reserve entry of another reservation", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) {
			id := uuid.New()
			m.Entries[0].Ref = &id
		}},
		{"reserve entry of another metric", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) {
			other := "other"
			m.Entries[0].Metric = &other
		}},
		{"reserve entry with a delta", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) { m.Entries[0].Delta = -1 }},
		{"main entry not last", func() engine.Mutation { return o.reserve(3, "") }, func(m *engine.Mutation) {
			m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry})
		}},
		{"multi-metric commit", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Reservation.Items = items }},
		{"commit charge off the entry", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Usage.Charged++ }},
		{"commit units off the entry", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Usage.Units++ }},
		{"commit overage off the entry", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Usage.Overage++ }},
		{"commit paid by a pool", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Usage.Pool = 5 }},
		{"commit of another reservation's usage", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { id := uuid.New(); m.Usage.ReservationID = &id }},
		{"commit without settled figures", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { m.Reservation.ActualCost = nil }},
		{"commit committed at another instant", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 2, 0, false) },
			func(m *engine.Mutation) { at := m.AtMS - 1; m.Reservation.CommittedMS = &at }},
		{"commit of 0 units with usage", func() engine.Mutation { return o.commit(*o.reserve(3, "").Reservation, 0, 0, false) },
			func(m *engine.Mutation) { m.Usage = &engine.MutationUsage{Metric: "tokens"} }},
		{"release still active", func() engine.Mutation { return o.release(*o.reserve(3, "").Reservation, false) },
			func(m *engine.Mutation) {
				m.Reservation.Status, m.Reservation.ReleasedMS = engine.ReservationActive, nil
			}},
		{"release with a delta", func() engine.Mutation { return o.release(*o.reserve(3, "").Reservation, false) },
			func(m *engine.Mutation) { m.Entries[0].Delta = 5 }},
		{"release of an unknown status", func() engine.Mutation { return o.release(*o.reserve(3, "").Reservation, false) },
			func(m *engine.Mutation) { m.Reservation.Status = "gone" }},
	} {
		m := tc.op()
		if _, _, ok := leanHead(&m); !ok {
			t.Fatalf("%s: the plain operation does not take the lean shape", tc.name)
		}
		tc.change(&m)
		if head, _, ok := leanHead(&m); ok {
			t.Errorf("%s: takes the lean shape (%q)", tc.name, head)
		}
	}
}

// TestReservationHeadVersion: every head, a consume's and a reservation's,
// holds the account version in its field 6 (bench/chaos/check.go reads it
// with split_part).
func TestReservationHeadVersion(t *testing.T) {
	t.Parallel()
	c := &leanCustomer{id: uuid.New(), block: uuid.New(), balance: 1_000_000}
	o := &reservationOps{c: c, tenant: uuid.New(), metric: "tokens"}
	r := o.reserve(3, `{"a":"|"}`)
	for _, m := range []engine.Mutation{c.consume(o.tenant), r, o.commit(*r.Reservation, 2, 0, true), o.release(*r.Reservation, false)} {
		head, _, ok := leanHead(&m)
		if !ok {
			t.Fatalf("%s: not lean", m.Kind)
		}
		f := strings.SplitN(head, "|", 7)
		if len(f) < 7 || f[5] != strconv.FormatInt(m.Account.Version, 10) {
			t.Errorf("%s head %q: field 6 %v, want the version %d", m.Kind, head, f, m.Account.Version)
		}
	}
}
