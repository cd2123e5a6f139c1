package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// funded makes a customer with two started blocks: 60 (priority 0) and 40
// (priority 1), balance 100, version 2.
func (b bundle) funded(t *testing.T) (engine.CustomerKey, [2]uuid.UUID) {
	t.Helper()
	c := newCustomer()
	b.known(t, c)
	g1, g2 := grantCmd(c, 60, t0.Add(-time.Minute)), grantCmd(c, 40, t0.Add(-time.Minute))
	g2.Block.Priority = 1
	b.grant(t, g1)
	b.grant(t, g2)
	return c, [2]uuid.UUID{g1.Block.ID, g2.Block.ID}
}

func consumeCmd(c engine.CustomerKey, units int64, terms engine.RuleTerms, policy engine.OveragePolicy, now time.Time) engine.ConsumeCommand {
	return engine.ConsumeCommand{
		CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, Metric: "api.calls", Units: units,
		Terms: terms, Policy: policy, Context: engine.MutationContext{ExternalID: "ext-1", ThresholdMC: 10, Policy: policy}}
}

func reserveCmd(c engine.CustomerKey, units int64, terms engine.RuleTerms, ttl time.Duration, now time.Time) engine.ReserveCommand {
	return engine.ReserveCommand{
		CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, ReservationID: uuid.New(), Metric: "gpu.seconds",
		EstimatedUnits: units, Terms: terms, ExpiresAt: now.Add(ttl)}
}

func commitCmd(c engine.CustomerKey, id uuid.UUID, units int64, terms engine.RuleTerms, now time.Time) engine.CommitCommand {
	return engine.CommitCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, ReservationID: id, ActualUnits: units, Terms: terms}
}

func releaseCmd(c engine.CustomerKey, id uuid.UUID, expire bool, now time.Time) engine.ReleaseCommand {
	return engine.ReleaseCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, ReservationID: id, Expire: expire}
}

func (b bundle) reserve(t *testing.T, cmd engine.ReserveCommand) engine.Mutation {
	t.Helper()
	res, err := b.store.Reserve(context.Background(), cmd)
	if err != nil {
		t.Fatalf("reserve: %v", err)
	}
	return res.Mutation
}

// withoutOutbox is a dump without its outbox lines: what a refusal, which
// only appends its refusal record, leaves unchanged.
func withoutOutbox(dump string) string {
	var keep []string
	for _, l := range strings.Split(dump, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "outbox ") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// reservationDump is dump plus the reservation-expiry zset, for refusals of reservation scripts.
func (b bundle) reservationDump(t *testing.T, c engine.CustomerKey, idemKeys ...string) string {
	t.Helper()
	z := b.rdb.ZRangeWithScores(context.Background(), b.store.reservationExpiryKey(Partition(c.CustomerID)), 0, -1).Val()
	return b.dump(t, c, idemKeys...) + fmt.Sprintf("rexp %v\n", z)
}

// draws renders a mutation's entries as "block:delta/units/overage[draws]".
func draws(m engine.Mutation, names map[uuid.UUID]string) []string {
	var out []string
	for _, e := range m.Entries {
		s := "-"
		if e.BlockID != nil {
			s = names[*e.BlockID]
		}
		s += fmt.Sprintf(":%d", e.Delta)
		if e.Units != nil {
			s += fmt.Sprintf("/u%d", *e.Units)
		}
		if e.Overage != nil {
			s += fmt.Sprintf("/o%d", *e.Overage)
		}
		if len(e.Draws) > 0 {
			var ds []string
			for _, d := range e.Draws {
				ds = append(ds, fmt.Sprintf("%s:%d", names[d.BlockID], d.Amount))
			}
			s += fmt.Sprint(ds)
		}
		out = append(out, s)
	}
	return out
}

// TestConsumePolicies: consume charges the effective balance in spend
// order; under block a short balance is refused (invariant 2) with no change
// to the account but one refusal record in the outbox; under allow and
// notify the charge takes what there is and the rest is overage.
func TestConsumePolicies(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name        string
		policy      engine.OveragePolicy
		terms       engine.RuleTerms
		units       int64
		wantErr     error
		wantDraws   []string
		wantCharged int64
		wantOverage int64
		wantBalance int64
	}{
		{"block within", engine.OveragePolicyBlock, perUnitTerms(10), 4, nil, []string{"b1:-40/u4"}, 40, 0, 60},
		{"block two blocks", engine.OveragePolicyBlock, perUnitTerms(10), 7, nil, []string{"-:-70/u7[b1:60 b2:10]"}, 70, 0, 30},
		{"block exact balance", engine.OveragePolicyBlock, perUnitTerms(10), 10, nil, []string{"-:-100/u10[b1:60 b2:40]"}, 100, 0, 0},
		{"block one short", engine.OveragePolicyBlock, perUnitTerms(101), 1, engine.ErrInsufficientCredits, nil, 0, 0, 100},
		{"allow overage split", engine.OveragePolicyAllow, perUnitTerms(13), 10, nil, []string{"-:-100/u10/o30[b1:60 b2:40]"}, 100, 30, 0},
		{"notify overage split", engine.OveragePolicyNotify, flatTerms(150), 3, nil, []string{"-:-100/u3/o50[b1:60 b2:40]"}, 100, 50, 0},
		{"allow within", engine.OveragePolicyAllow, perUnitTerms(1), 5, nil, []string{"b1:-5/u5"}, 5, 0, 95},
		{"zero cost", engine.OveragePolicyBlock, flatTerms(0), 9, nil, []string{"-:0/u9"}, 0, 0, 100},
		{"tiered", engine.OveragePolicyBlock, tieredTerms(engine.TierGraduated, tier(ptr[int64](2), 10, 5), tier(nil, 1, 0)), 4, nil, []string{"b1:-27/u4"}, 27, 0, 73},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				c, ids := b.funded(t)
				names := map[uuid.UUID]string{ids[0]: "b1", ids[1]: "b2"}
				cmd := consumeCmd(c, tc.units, tc.terms, tc.policy, t0)
				cmd.IdempotencyKey, cmd.RequestHash = "consume-1", "h1"
				cmd.EntryMetadata = engine.Metadata{"job": json.RawMessage(`"j1"`)}
				before := b.dump(t, c, "consume-1")
				res, err := b.store.Consume(context.Background(), cmd)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err %v, want %v", err, tc.wantErr)
					}
					ob := b.outbox(t, c)
					refusal := ob[len(ob)-1]
					u := refusal.Usage
					if refusal.Kind != engine.MutationConsume || u == nil || !u.Refused || u.Charged != 0 || u.Overage != 0 ||
						u.Cost != tc.terms.UnitCost*tc.units || u.Metric != "api.calls" || u.Units != tc.units ||
						len(refusal.Entries) != 0 || len(refusal.Blocks) != 0 || refusal.Account.Version != 2 ||
						refusal.IdempotencyKey != "" || refusal.EffectiveBefore == nil || *refusal.EffectiveBefore != 100 ||
						refusal.Context == nil || refusal.Context.ExternalID != "ext-1" {
						t.Errorf("refusal record %+v usage %+v", refusal, u)
					}
					// Only the outbox grew: the account and the op key are untouched.
					b.rdb.XDel(context.Background(), b.store.outboxKey(Partition(c.CustomerID)), lastOutboxID(t, b, c))
					if after := b.dump(t, c, "consume-1"); after != before {
						t.Errorf("refused consume changed state:\n%s\n->\n%s", before, after)
					}
					return
				}
				if err != nil {
					t.Fatalf("consume: %v", err)
				}
				// The answer is the compact record's figures; the whole
				// Mutation, with its draws, is the outbox's.
				if r := res.Mutation; r.OpID != cmd.OpID || r.Usage == nil || r.Usage.Charged != tc.wantCharged ||
					r.Usage.Overage != tc.wantOverage || r.Account.Balance != tc.wantBalance || r.CustomerID != c.CustomerID {
					t.Errorf("answer %+v usage %+v", r, r.Usage)
				}
				ob := b.outbox(t, c)
				m := ob[len(ob)-1]
				if m.OpID != cmd.OpID {
					t.Fatalf("outbox's last Mutation is op %s, want %s", m.OpID, cmd.OpID)
				}
				if got := draws(m, names); fmt.Sprint(got) != fmt.Sprint(tc.wantDraws) {
					t.Errorf("entries %v, want %v", got, tc.wantDraws)
				}
				u := m.Usage
				if u == nil || u.Charged != tc.wantCharged || u.Overage != tc.wantOverage || u.Cost != tc.wantCharged+tc.wantOverage ||
					u.Units != tc.units || u.Metric != "api.calls" || u.Refused || u.ReservationID != nil {
					t.Errorf("usage %+v", u)
				}
				if m.Kind != engine.MutationConsume || m.Account.Version != 3 || m.Account.Balance != tc.wantBalance ||
					*m.EffectiveBefore != 100 || m.Context == nil || m.Context.Policy != tc.policy {
					t.Errorf("mutation %+v", m)
				}
				for _, e := range m.Entries {
					if e.Type != engine.EntryConsumption || e.Role != engine.RoleMain || *e.Metric != "api.calls" ||
						string(e.Metadata) != `{"job":"j1"}` || (e.BlockID != nil && *e.Source != engine.SourceManual) {
						t.Errorf("entry %+v", e)
					}
				}
				if a := b.snapshot(t, c, t0); a.Balance != tc.wantBalance || a.EffectiveBalance != tc.wantBalance {
					t.Errorf("snapshot %+v", a)
				}
				// A retry replays; another body with the key is refused.
				again := cmd
				again.OpID = uuid.New()
				r2, err := b.store.Consume(context.Background(), again)
				if err != nil || !r2.Replayed || r2.Mutation.OpID != cmd.OpID {
					t.Errorf("replay: %v %+v", err, r2)
				}
				// The compact op record answers with the numbers of the
				// original: usage, account figures, the consumption entry at
				// its index, the instant and the customer.
				if err == nil {
					o, g := m, r2.Mutation
					main := len(o.Entries) - 1
					if !reflect.DeepEqual(*g.Usage, *o.Usage) || g.Account.Balance != o.Account.Balance || g.Account.Reserved != o.Account.Reserved ||
						g.Account.Pending != o.Account.Pending || g.AtMS != o.AtMS || g.CustomerID != c.CustomerID ||
						g.TenantID != c.TenantID || g.Environment != c.Environment || len(g.Entries) != len(o.Entries) ||
						g.Entries[main].Role != engine.RoleMain || g.Entries[main].Delta != o.Entries[main].Delta ||
						*g.Entries[main].Units != *o.Entries[main].Units || *g.Entries[main].Metric != *o.Entries[main].Metric {
						t.Errorf("replayed %+v\nwant numbers of %+v", g, o)
					}
				}
				again.RequestHash = "h2"
				if _, err := b.store.Consume(context.Background(), again); !errors.Is(err, engine.ErrIdempotencyMismatch) {
					t.Errorf("other body: %v", err)
				}
				if n := len(b.outbox(t, c)); n != 3 {
					t.Errorf("outbox has %d entries, want 3", n)
				}
			})
		})
	}
}

func lastOutboxID(t *testing.T, b bundle, c engine.CustomerKey) string {
	t.Helper()
	msgs := b.rdb.XRevRangeN(context.Background(), b.store.outboxKey(Partition(c.CustomerID)), "+", "-", 1).Val()
	if len(msgs) != 1 {
		t.Fatal("empty outbox")
	}
	return msgs[0].ID
}

// TestConsumeEffectiveBalance: reserved and pending credit are not free to
// consume; under allow a customer with no free credit (or no account at
// all) records the whole cost as overage on one zero-delta entry.
func TestConsumeEffectiveBalance(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		b.reserve(t, reserveCmd(c, 70, perUnitTerms(1), time.Hour, t0))
		if _, err := b.store.Consume(ctx, consumeCmd(c, 31, perUnitTerms(1), engine.OveragePolicyBlock, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("consume past the reserved credit: %v", err)
		}
		res, err := b.store.Consume(ctx, consumeCmd(c, 30, perUnitTerms(1), engine.OveragePolicyBlock, t0))
		if err != nil || res.Mutation.Account.Balance != 70 || res.Mutation.Account.Reserved != 70 {
			t.Fatalf("consume of the free credit: %v %+v", err, res.Mutation.Account)
		}
		res, err = b.store.Consume(ctx, consumeCmd(c, 5, perUnitTerms(2), engine.OveragePolicyAllow, t0))
		if err != nil || fmt.Sprint(draws(res.Mutation, nil)) != "[-:0/u5/o10]" || res.Mutation.Usage.Overage != 10 ||
			res.Mutation.Usage.Charged != 0 || res.Mutation.Account.Balance != 70 {
			t.Errorf("overage without free credit: %v %v %+v", err, draws(res.Mutation, nil), res.Mutation.Usage)
		}

		// A customer without an account: allow records overage, block refuses.
		n := newCustomer()
		b.known(t, n)
		res, err = b.store.Consume(ctx, consumeCmd(n, 1, flatTerms(5), engine.OveragePolicyNotify, t0))
		if err != nil || res.Mutation.Usage.Overage != 5 || res.Mutation.Account.Version != 1 || res.Mutation.Account.ID != "" {
			t.Errorf("no account, notify: %v %+v", err, res.Mutation)
		}
		if _, err := b.store.Consume(ctx, consumeCmd(n, 1, flatTerms(5), engine.OveragePolicyBlock, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("no account, block: %v", err)
		}
		if _, err := b.store.Consume(ctx, consumeCmd(n, 1, perUnitTerms(1<<62), engine.OveragePolicyAllow, t0)); err != nil {
			t.Errorf("big cost under allow: %v", err)
		}
		if _, err := b.store.Consume(ctx, consumeCmd(n, 4, perUnitTerms(1<<62), engine.OveragePolicyAllow, t0)); !errors.Is(err, engine.ErrOverflow) {
			t.Errorf("cost past int64: %v", err)
		}
		if _, err := b.store.Consume(ctx, consumeCmd(n, 0, flatTerms(1), engine.OveragePolicyAllow, t0)); err == nil {
			t.Errorf("0 units accepted")
		}
		if _, err := b.store.Consume(ctx, consumeCmd(newCustomer(), 1, flatTerms(1), engine.OveragePolicyAllow, t0)); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("unknown customer: %v", err)
		}
	})
}

// TestContextAndEffectiveBefore: every money script writes eb (the
// effective balance before the change); the hot-path scripts splice the
// context Go gave them; grant and debit omit it.
func TestContextAndEffectiveBefore(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c, _ := b.funded(t)
		m := b.grant(t, grantCmd(c, 5, t0))
		if m.EffectiveBefore == nil || *m.EffectiveBefore != 100 || m.Context != nil {
			t.Errorf("grant eb %v ctx %v", m.EffectiveBefore, m.Context)
		}
		res, err := b.store.Debit(context.Background(), debitCmd(c, 5, t0))
		if err != nil || *res.Mutation.EffectiveBefore != 105 {
			t.Errorf("debit: %v %+v", err, res.Mutation)
		}
		cmd := consumeCmd(c, 1, perUnitTerms(1), engine.OveragePolicyNotify, t0)
		cmd.Context.Emitter = "usage"
		res, err = b.store.Consume(context.Background(), cmd)
		if err != nil || *res.Mutation.EffectiveBefore != 100 || res.Mutation.Context == nil ||
			!reflect.DeepEqual(*res.Mutation.Context, cmd.Context) {
			t.Errorf("consume: %v %+v", err, res.Mutation.Context)
		}
	})
}

// TestReservationLifecycle walks the Reservation state table: a reservation raises
// reserved_balance only; commit above the reservation takes the difference from the
// free balance; a finalized reservation answers 409 to commit and release; commit
// with 0 units returns the reservation; release works past expires_at.
func TestReservationLifecycle(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, ids := b.funded(t)
		names := map[uuid.UUID]string{ids[0]: "b1", ids[1]: "b2"}
		p := Partition(c.CustomerID)

		rc := reserveCmd(c, 3, perUnitTerms(10), 30*time.Minute, t0)
		rc.Metadata = engine.Metadata{"a": json.RawMessage(`1`), "b": json.RawMessage(`"x"`)}
		rc.IdempotencyKey, rc.RequestHash = "res-1", "rh"
		m := b.reserve(t, rc)
		r := m.Reservation
		if m.Kind != engine.MutationReserve || r == nil || r.ID != rc.ReservationID || r.Status != engine.ReservationActive ||
			r.EstimatedUnits != 3 || r.EstimatedCost != 30 || r.ExpiresMS != rc.ExpiresAt.UnixMilli() || r.CreatedMS != t0.UnixMilli() ||
			r.Metric != "gpu.seconds" || r.Released != 0 || r.ActualUnits != nil || r.CommittedMS != nil || string(r.Metadata) != `{"a":1,"b":"x"}` {
			t.Errorf("reserve mutation %+v res %+v", m, r)
		}
		if m.Account.Balance != 100 || m.Account.Reserved != 30 || m.Account.Version != 3 || *m.EffectiveBefore != 100 ||
			len(m.Entries) != 1 || m.Entries[0].Type != engine.EntryReservation || m.Entries[0].Delta != 0 ||
			*m.Entries[0].Ref != rc.ReservationID || m.Entries[0].BlockID != nil || *m.Entries[0].Metric != "gpu.seconds" {
			t.Errorf("reserve account %+v entries %+v", m.Account, m.Entries)
		}
		if a := b.snapshot(t, c, t0); a.Balance != 100 || a.ReservedBalance != 30 || a.EffectiveBalance != 70 {
			t.Errorf("after reserve %+v", a)
		}
		if rr, err := b.store.Reserve(ctx, rc); err != nil || !rr.Replayed || rr.Mutation.OpID != rc.OpID {
			t.Errorf("reserve replay: %v %+v", err, rr)
		}
		if h, ok, err := b.store.ReservationRef(ctx, rc.ReservationID); err != nil || !ok || h.Customer != c ||
			!h.Described || h.Metric != "gpu.seconds" || h.Items != nil {
			t.Errorf("reservation reservation: %+v %v %v", h, ok, err)
		}
		if _, ok, err := b.store.ReservationRef(ctx, uuid.New()); ok || err != nil {
			t.Errorf("unknown reservation reservation: %v %v", ok, err)
		}
		// A record an older version wrote names the customer alone: the
		// engine then takes Postgres's path.
		older := uuid.New()
		if err := b.store.rdb.Set(ctx, b.store.reservationIndexKey(older), customerMember(c), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if h, ok, err := b.store.ReservationRef(ctx, older); err != nil || !ok || h.Customer != c || h.Described {
			t.Errorf("older reservation record: %+v %v %v", h, ok, err)
		}
		if meta, found, err := b.store.ReservationMetadata(ctx, c, rc.ReservationID); err != nil || !found ||
			len(meta) != 2 || string(meta["a"]) != "1" || string(meta["b"]) != `"x"` {
			t.Errorf("reservation metadata: %v %v %v", meta, found, err)
		}
		if _, found, err := b.store.ReservationMetadata(ctx, c, uuid.New()); found || err != nil {
			t.Errorf("unknown reservation metadata: %v %v", found, err)
		}
		if due, _ := b.store.DueReservations(ctx, p, rc.ExpiresAt.Add(-time.Millisecond), 10); len(due) != 0 {
			t.Errorf("due before expiry: %v", due)
		}
		due, err := b.store.DueReservations(ctx, p, rc.ExpiresAt, 10)
		if err != nil || len(due) != 1 || due[0] != (engine.DueReservation{Customer: c, ReservationID: rc.ReservationID}) {
			t.Errorf("due at expiry: %v %v", due, err)
		}

		// More than the effective balance cannot be held; nothing changes but
		// the outbox, which gets a refusal record for credit.exhausted.
		before := b.reservationDump(t, c)
		obBefore := len(b.outbox(t, c))
		if _, err := b.store.Reserve(ctx, reserveCmd(c, 71, perUnitTerms(1), time.Hour, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("reserve past effective: %v", err)
		}
		// Commit beyond reservation + free balance (30 + 70) is refused; the reservation stays.
		cc := commitCmd(c, rc.ReservationID, 11, perUnitTerms(10), t0.Add(time.Minute))
		if _, err := b.store.Commit(ctx, cc); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("commit past reservation and free balance: %v", err)
		}
		if after := b.reservationDump(t, c); withoutOutbox(after) != withoutOutbox(before) {
			t.Errorf("refusals changed state:\n%s\n->\n%s", before, after)
		}
		ob := b.outbox(t, c)
		if len(ob) != obBefore+2 {
			t.Fatalf("refusals appended %d outbox records, want 2", len(ob)-obBefore)
		}
		for i, kind := range []engine.MutationKind{engine.MutationReserve, engine.MutationCommit} {
			m := ob[obBefore+i]
			if m.Kind != kind || m.Usage == nil || !m.Usage.Refused || m.Usage.Charged != 0 || len(m.Entries) != 0 ||
				m.IdempotencyKey != "" || m.Reservation != nil || m.Usage.Metric != "gpu.seconds" {
				t.Errorf("%s refusal record %+v usage %+v", kind, m, m.Usage)
			}
		}

		// Commit of 8 units at the current rate 10 (80 > reservation 30): exact.
		cc = commitCmd(c, rc.ReservationID, 8, perUnitTerms(10), t0.Add(time.Minute))
		cc.Metadata = engine.Metadata{"b": json.RawMessage(`"y"`), "c": json.RawMessage(`[1,{"d":2}]`)}
		cc.IdempotencyKey, cc.RequestHash = "commit-1", "rh"
		res, err := b.store.Commit(ctx, cc)
		if err != nil {
			t.Fatalf("commit: %v", err)
		}
		m = res.Mutation
		r = m.Reservation
		if m.Kind != engine.MutationCommit || r.Status != engine.ReservationCommitted || *r.ActualUnits != 8 || *r.ActualCost != 80 ||
			r.Released != 30 || r.CommittedMS == nil || *r.CommittedMS != cc.Now.UnixMilli() || r.ReleasedMS != nil ||
			string(r.Metadata) != `{"a":1,"b":"y","c":[1,{"d":2}]}` {
			t.Errorf("commit res %+v meta %s", r, r.Metadata)
		}
		if u := m.Usage; u == nil || u.Cost != 80 || u.Charged != 80 || u.Overage != 0 || u.Units != 8 ||
			u.ReservationID == nil || *u.ReservationID != rc.ReservationID || u.Metric != "gpu.seconds" {
			t.Errorf("commit usage %+v", m.Usage)
		}
		if got := fmt.Sprint(draws(m, names)); got != "[-:-80/u8[b1:60 b2:20]]" {
			t.Errorf("commit entries %s", got)
		}
		for _, e := range m.Entries {
			if e.Type != engine.EntryConsumption || *e.Ref != rc.ReservationID || *e.Metric != "gpu.seconds" {
				t.Errorf("commit entry %+v", e)
			}
		}
		if m.Account.Balance != 20 || m.Account.Reserved != 0 || *m.EffectiveBefore != 70 {
			t.Errorf("commit account %+v eb %d", m.Account, *m.EffectiveBefore)
		}
		if a := b.snapshot(t, c, cc.Now); a.Balance != 20 || a.ReservedBalance != 0 || a.EffectiveBalance != 20 {
			t.Errorf("after commit %+v", a)
		}
		if due, _ := b.store.DueReservations(ctx, p, rc.ExpiresAt.Add(time.Hour), 10); len(due) != 0 {
			t.Errorf("committed reservation still due: %v", due)
		}
		if rr, err := b.store.Commit(ctx, cc); err != nil || !rr.Replayed {
			t.Errorf("commit replay: %v", err)
		}
		// Finalized: a second commit or release is a 409.
		if _, err := b.store.Commit(ctx, commitCmd(c, rc.ReservationID, 1, perUnitTerms(1), cc.Now)); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("double commit: %v", err)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, rc.ReservationID, false, cc.Now)); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("release after commit: %v", err)
		}
		if _, err := b.store.Commit(ctx, commitCmd(c, uuid.New(), 1, perUnitTerms(1), cc.Now)); !errors.Is(err, engine.ErrReservationNotFound) {
			t.Errorf("commit of an unknown reservation: %v", err)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, uuid.New(), false, cc.Now)); !errors.Is(err, engine.ErrReservationNotFound) {
			t.Errorf("release of an unknown reservation: %v", err)
		}

		// Commit with 0 units returns the whole reservation; status committed.
		r0 := b.reserve(t, reserveCmd(c, 2, perUnitTerms(5), time.Hour, cc.Now)).Reservation
		res, err = b.store.Commit(ctx, commitCmd(c, r0.ID, 0, engine.RuleTerms{}, cc.Now))
		if err != nil {
			t.Fatalf("commit 0: %v", err)
		}
		m = res.Mutation
		if m.Usage != nil || len(m.Entries) != 1 || m.Entries[0].Type != engine.EntryRelease || m.Entries[0].Delta != 0 ||
			*m.Entries[0].Ref != r0.ID || m.Reservation.Status != engine.ReservationCommitted || *m.Reservation.ActualUnits != 0 ||
			*m.Reservation.ActualCost != 0 || m.Reservation.Released != 10 || m.Account.Reserved != 0 || m.Account.Balance != 20 {
			t.Errorf("commit 0: %+v res %+v", m, m.Reservation)
		}

		// Past expires_at: commit is reservation-expired (nothing changes),
		// a manual release still works.
		r1 := b.reserve(t, reserveCmd(c, 4, perUnitTerms(5), time.Minute, cc.Now)).Reservation
		late := time.UnixMilli(r1.ExpiresMS)
		before = b.reservationDump(t, c)
		if _, err := b.store.Commit(ctx, commitCmd(c, r1.ID, 1, perUnitTerms(1), late)); !errors.Is(err, engine.ErrReservationExpired) {
			t.Errorf("commit at expires_at: %v", err)
		}
		if after := b.reservationDump(t, c); after != before {
			t.Errorf("expired commit changed state")
		}
		res, err = b.store.Release(ctx, releaseCmd(c, r1.ID, false, late.Add(time.Second)))
		if err != nil || res.Mutation.Reservation.Status != engine.ReservationReleased || res.Mutation.Reservation.Released != 20 ||
			*res.Mutation.Reservation.ReleasedMS != late.Add(time.Second).UnixMilli() || res.Mutation.Account.Reserved != 0 ||
			res.Mutation.Kind != engine.MutationRelease || res.Mutation.Entries[0].Type != engine.EntryRelease {
			t.Errorf("release after expiry: %v %+v", err, res.Mutation.Reservation)
		}
		if a := b.snapshot(t, c, late); a.Balance != 20 || a.ReservedBalance != 0 || a.EffectiveBalance != 20 {
			t.Errorf("final account %+v", a)
		}
	})
}

// TestReservationSweep: the sweep's expiry (Release with Expire) waits for
// expires_at, marks the reservation expired and takes it off the due list; stale
// due entries are cleaned up.
func TestReservationSweep(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		p := Partition(c.CustomerID)
		r := b.reserve(t, reserveCmd(c, 25, perUnitTerms(1), time.Minute, t0)).Reservation
		exp := time.UnixMilli(r.ExpiresMS)
		_, err := b.store.Release(ctx, releaseCmd(c, r.ID, true, exp.Add(-time.Millisecond)))
		if !errors.Is(err, ErrReservationNotDue) || !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("expire before due: %v", err)
		}
		due, _ := b.store.DueReservations(ctx, p, exp, 10)
		if len(due) != 1 {
			t.Fatalf("due %v", due)
		}
		res, err := b.store.Release(ctx, releaseCmd(c, due[0].ReservationID, true, exp))
		if err != nil || res.Mutation.Reservation.Status != engine.ReservationExpired || res.Mutation.Account.Reserved != 0 ||
			res.Mutation.Reservation.ReleasedMS == nil || res.Mutation.Reservation.Released != 25 {
			t.Fatalf("sweep expiry: %v %+v", err, res.Mutation.Reservation)
		}
		if due, _ := b.store.DueReservations(ctx, p, exp.Add(time.Hour), 10); len(due) != 0 {
			t.Errorf("still due: %v", due)
		}
		if _, err := b.store.Commit(ctx, commitCmd(c, r.ID, 1, perUnitTerms(1), exp)); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("commit after the sweep: %v", err)
		}
		// A stale due entry (its reservation gone) is dropped by the sweep's call.
		member := reservationMember(c, uuid.New())
		b.rdb.ZAdd(ctx, b.store.reservationExpiryKey(p), redisZ(float64(exp.UnixMilli()), member))
		due, _ = b.store.DueReservations(ctx, p, exp, 10)
		if len(due) != 1 {
			t.Fatalf("stale due %v", due)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, due[0].ReservationID, true, exp)); !errors.Is(err, engine.ErrReservationNotFound) {
			t.Errorf("stale expiry: %v", err)
		}
		if due, _ := b.store.DueReservations(ctx, p, exp, 10); len(due) != 0 {
			t.Errorf("stale entry kept: %v", due)
		}
	})
}

// TestFinalizedReservationsKeptAWhile: a finalized reservation answers 409 for
// reservationKeep, then the next script on the account drops it (the store
// says 404 after that; the engine answers 409 from Postgres).
func TestFinalizedReservationsKeptAWhile(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		r := b.reserve(t, reserveCmd(c, 5, perUnitTerms(1), time.Hour, t0)).Reservation
		if _, err := b.store.Release(ctx, releaseCmd(c, r.ID, false, t0)); err != nil {
			t.Fatal(err)
		}
		field := "r:" + r.ID.String()
		b.grant(t, grantCmd(c, 1, t0.Add(reservationKeep-time.Millisecond)))
		if _, err := b.store.Release(ctx, releaseCmd(c, r.ID, false, t0.Add(reservationKeep))); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("release within the keep window: %v", err)
		}
		b.grant(t, grantCmd(c, 1, t0.Add(reservationKeep)))
		if b.rdb.HExists(ctx, b.store.accountKey(c.CustomerID), field).Val() {
			t.Errorf("finalized reservation kept past the keep window")
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, r.ID, false, t0.Add(reservationKeep+time.Hour))); !errors.Is(err, engine.ErrReservationNotFound) {
			t.Errorf("release after the keep window: %v", err)
		}
	})
}

// TestGauges: increments stop at the cap under block (409 with current,
// cap, shortfall; nothing changed), pass it when allowed; a decrement never
// goes below zero; GaugeValue reads the count.
func TestGauges(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		if v, err := b.store.GaugeValue(ctx, c, "seats"); err != nil || v != 0 {
			t.Errorf("unused gauge: %d %v", v, err)
		}
		if _, err := b.store.GaugeValue(ctx, newCustomer(), "seats"); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("unknown customer: %v", err)
		}
		gauge := func(delta, cap int64, allow bool) (engine.MutationResult, error) {
			return b.store.Gauge(ctx, engine.GaugeCommand{
				CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0}, Metric: "seats",
				Delta: delta, Cap: cap, Allow: allow})
		}
		steps := []struct {
			delta   int64
			allow   bool
			want    int64
			wantErr string
		}{
			{4, false, 4, ""},
			{6, false, 10, ""}, // exactly the cap
			{1, false, 10, "cap 10 1"},
			{3, false, 10, "cap 10 3"},
			{5, true, 15, ""},
			{1, false, 15, "cap 10 6"}, // already over: shortfall counts from the cap
			{-16, false, 15, "below"},
			{-15, false, 0, ""},
			{-1, false, 0, "below"},
		}
		version := int64(0)
		for i, s := range steps {
			before := b.dump(t, c)
			res, err := gauge(s.delta, 10, s.allow)
			switch s.wantErr {
			case "":
				version++
				g := res.Mutation.Gauge
				if err != nil || g == nil || g.Metric != "seats" || g.Current != s.want || res.Mutation.Kind != engine.MutationGaugeKind ||
					res.Mutation.Account.Version != version || len(res.Mutation.Entries) != 0 {
					t.Errorf("step %d: %v %+v", i, err, res.Mutation)
				}
			case "below":
				if !errors.Is(err, engine.ErrGaugeBelowZero) {
					t.Errorf("step %d: %v, want below zero", i, err)
				}
			default:
				e, ok := engine.AsError(err)
				if !ok || e.Kind != engine.KindConflict || fmt.Sprintf("cap %v %v", e.Extra["cap"], e.Extra["shortfall"]) != s.wantErr ||
					e.Extra["current"] != s.want {
					t.Errorf("step %d: %v %+v, want %s", i, err, e, s.wantErr)
				}
			}
			if s.wantErr != "" {
				if after := b.dump(t, c); after != before {
					t.Errorf("step %d: refusal changed state", i)
				}
			}
			if v, err := b.store.GaugeValue(ctx, c, "seats"); err != nil || v != s.want {
				t.Errorf("step %d: value %d %v, want %d", i, v, err, s.want)
			}
		}
		cmd := engine.GaugeCommand{
			CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, IdempotencyKey: "g-1", RequestHash: "h", Now: t0}, Metric: "seats", Delta: 2, Cap: 10,
		}
		first, err := b.store.Gauge(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		cmd.OpID = uuid.New()
		again, err := b.store.Gauge(ctx, cmd)
		if err != nil || !again.Replayed || again.Mutation.OpID != first.Mutation.OpID {
			t.Errorf("gauge replay: %v %+v", err, again)
		}
		if v, _ := b.store.GaugeValue(ctx, c, "seats"); v != 2 {
			t.Errorf("after replay %d, want 2", v)
		}
	})
}

// TestLoadRestoresReservationsAndGauges: a rebuilt customer gets its active reservations
// (committable, due to the sweep at their expiry), its recently finalized
// reservations (409), not those finalized a day ago, and its gauges (invariant 5).
func TestLoadRestoresReservationsAndGauges(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		active, done, old := uuid.New(), uuid.New(), uuid.New()
		exp := t0.Add(time.Hour).UnixMilli()
		st := engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: "acct", Version: 9, Reserved: 30, LifetimeEarned: 100, UpdatedAtMS: t0.UnixMilli() - 1,
			Blocks: []engine.MutationBlock{{ID: uuid.New(), Original: 100, Remaining: 100, Source: engine.SourceManual,
				StartsMS: t0.UnixMilli() - 10, CreatedMS: t0.UnixMilli() - 10}},
			Reservations: []engine.MutationReservation{
				{ID: active, Metric: "gpu", EstimatedUnits: 3, EstimatedCost: 30, Status: engine.ReservationActive,
					ExpiresMS: exp, CreatedMS: t0.UnixMilli() - 5, Metadata: json.RawMessage(`{ "k" : "v" }`)},
				{ID: done, Metric: "gpu", EstimatedUnits: 1, EstimatedCost: 10, ActualUnits: ptr[int64](1), ActualCost: ptr[int64](10),
					Released: 10, Status: engine.ReservationCommitted, ExpiresMS: exp, CreatedMS: t0.UnixMilli() - 5,
					CommittedMS: ptr(t0.UnixMilli() - 1000)},
				{ID: old, Metric: "gpu", EstimatedUnits: 1, EstimatedCost: 10, Released: 10, Status: engine.ReservationReleased,
					ExpiresMS: exp, CreatedMS: t0.UnixMilli() - 5, ReleasedMS: ptr(t0.Add(-25 * time.Hour).UnixMilli())},
			},
			Gauges: map[string]int64{"seats": 3, "projects": 1 << 60},
		}
		b.load(t, st)
		if a := b.snapshot(t, c, t0); a.Balance != 100 || a.ReservedBalance != 30 || a.EffectiveBalance != 70 || a.Version != 9 {
			t.Errorf("loaded account %+v", a)
		}
		for metric, want := range st.Gauges {
			if v, err := b.store.GaugeValue(ctx, c, metric); err != nil || v != want {
				t.Errorf("gauge %s: %d %v", metric, v, err)
			}
		}
		due, _ := b.store.DueReservations(ctx, Partition(c.CustomerID), time.UnixMilli(exp), 10)
		if len(due) != 1 || due[0].ReservationID != active {
			t.Errorf("due after load: %v", due)
		}
		if _, err := b.store.Commit(ctx, commitCmd(c, done, 1, perUnitTerms(1), t0)); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("commit of a loaded committed reservation: %v", err)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, old, false, t0)); !errors.Is(err, engine.ErrReservationNotFound) {
			t.Errorf("reservation finalized a day ago: %v", err)
		}
		cc := commitCmd(c, active, 4, perUnitTerms(10), t0)
		cc.Metadata = engine.Metadata{"z": json.RawMessage(`true`)}
		res, err := b.store.Commit(ctx, cc)
		if err != nil {
			t.Fatalf("commit of a loaded reservation: %v", err)
		}
		m := res.Mutation
		if m.Account.Version != 10 || m.Account.Balance != 60 || m.Account.Reserved != 0 || m.Reservation.Released != 30 ||
			m.Reservation.CreatedMS != t0.UnixMilli()-5 || string(m.Reservation.Metadata) != `{"k":"v","z":true}` {
			t.Errorf("commit after load: %+v res %+v meta %s", m.Account, m.Reservation, m.Reservation.Metadata)
		}
		// A stale load (older version) restores nothing.
		st.Version = 8
		if ok, err := b.store.LoadAt(ctx, st, t0); err != nil || ok {
			t.Errorf("stale load: %v %v", ok, err)
		}
	})
}

// TestConcurrentConsumesNoDoubleSpend: 100 goroutines consume a cost of 1
// under block against credit for exactly K on real Redis: exactly K
// succeed, the balance ends at 0 and every refusal is recorded (invariant 2).
func TestConcurrentConsumesNoDoubleSpend(t *testing.T) {
	t.Parallel()
	const k, workers = 37, 100
	b := backends[1].open(t)
	c := newCustomer()
	b.known(t, c)
	b.grant(t, grantCmd(c, k, t0))
	succeeded, short := race(t, workers, func(i int) error {
		cmd := consumeCmd(c, 1, perUnitTerms(1), engine.OveragePolicyBlock, t0.Add(time.Duration(i)*time.Millisecond))
		cmd.IdempotencyKey, cmd.RequestHash = fmt.Sprintf("w%d", i), "h"
		_, err := b.store.Consume(context.Background(), cmd)
		return err
	})
	if succeeded != k || short != workers-k {
		t.Errorf("%d succeeded and %d refused, want %d and %d", succeeded, short, k, workers-k)
	}
	a := b.snapshot(t, c, t0.Add(time.Minute))
	if a.Balance != 0 || a.EffectiveBalance != 0 || a.Version != 1+k {
		t.Errorf("final balance %d effective %d version %d, want 0, 0 and %d", a.Balance, a.EffectiveBalance, a.Version, 1+k)
	}
	refused := 0
	for _, m := range b.outbox(t, c) {
		if m.Usage != nil && m.Usage.Refused {
			refused++
		}
	}
	if refused != workers-k {
		t.Errorf("%d refusal records, want %d", refused, workers-k)
	}
}

// TestConcurrentReservesNoOverhold: 100 goroutines reserve a cost of 1
// against credit for exactly K on real Redis: exactly K reservations are active,
// the effective balance ends at exactly 0, never below (invariant 2).
func TestConcurrentReservesNoOverhold(t *testing.T) {
	t.Parallel()
	const k, workers = 23, 100
	b := backends[1].open(t)
	c := newCustomer()
	b.known(t, c)
	b.grant(t, grantCmd(c, k, t0))
	succeeded, short := race(t, workers, func(int) error {
		_, err := b.store.Reserve(context.Background(), reserveCmd(c, 1, perUnitTerms(1), time.Hour, t0))
		return err
	})
	if succeeded != k || short != workers-k {
		t.Errorf("%d succeeded and %d refused, want %d and %d", succeeded, short, k, workers-k)
	}
	a := b.snapshot(t, c, t0)
	if a.Balance != k || a.ReservedBalance != k || a.EffectiveBalance != 0 {
		t.Errorf("final account %+v", a)
	}
	due, err := b.store.DueReservations(context.Background(), Partition(c.CustomerID), t0.Add(time.Hour), 1000)
	if err != nil || len(due) != k {
		t.Errorf("%d active reservations (%v), want %d", len(due), err, k)
	}
}

// reservationMember is release.lua's reservation-expiry zset member for id of c.
func reservationMember(c engine.CustomerKey, id uuid.UUID) string {
	return customerMember(c) + "|" + id.String()
}

func redisZ(score float64, member string) redis.Z { return redis.Z{Score: score, Member: member} }

// TestCommitPastFundsUnderAllow: under allow a commit whose cost passes the
// reservation plus the free balance takes what is there and records the rest as
// overage (actual_cost reads higher than what was collected); under block
// the same commit is refused with nothing changed.
func TestCommitPastFundsUnderAllow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t) // balance 100
		r := b.reserve(t, reserveCmd(c, 30, perUnitTerms(1), time.Hour, t0)).Reservation
		block := commitCmd(c, r.ID, 150, perUnitTerms(1), t0)
		block.Context = engine.MutationContext{Policy: engine.OveragePolicyBlock}
		if _, err := b.store.Commit(ctx, block); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("block commit past funds: %v", err)
		}
		allow := commitCmd(c, r.ID, 150, perUnitTerms(1), t0)
		allow.Context = engine.MutationContext{Policy: engine.OveragePolicyAllow}
		res, err := b.store.Commit(ctx, allow)
		if err != nil {
			t.Fatal(err)
		}
		u, m := res.Mutation.Usage, res.Mutation
		if u == nil || u.Cost != 150 || u.Charged != 100 || u.Overage != 50 {
			t.Fatalf("usage %+v, want cost 150 charged 100 overage 50", u)
		}
		var overage, delta int64
		for _, e := range m.Entries {
			delta += e.Delta
			if e.Overage != nil {
				overage += *e.Overage
			}
		}
		if delta != -100 || overage != 50 || m.Account.Balance != 0 || m.Account.Reserved != 0 {
			t.Fatalf("entries delta %d overage %d, account %+v", delta, overage, m.Account)
		}
		if m.Reservation == nil || m.Reservation.ActualCost == nil || *m.Reservation.ActualCost != 150 {
			t.Fatalf("actual cost %+v, want 150", m.Reservation)
		}
	})
}

// TestConsumeBatch: a batch runs each consume as Consume would, one
// customer's in the batch's order (the second spends what the first left),
// a key repeated within the batch replays the first, a customer Redis does
// not hold answers ErrStateMissing without touching the others, and a
// shortfall refuses only its own command.
func TestConsumeBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		a, _ := b.funded(t) // balance 100
		o, _ := b.funded(t) // balance 100
		missing := newCustomer()
		keyed := func(c engine.CustomerKey, units int64, key string) engine.ConsumeCommand {
			cmd := consumeCmd(c, units, perUnitTerms(10), engine.OveragePolicyBlock, t0)
			cmd.IdempotencyKey, cmd.RequestHash = key, "rh-"+key
			return cmd
		}
		cmds := []engine.ConsumeCommand{
			keyed(a, 7, "a1"),       // 70: a at 30
			keyed(o, 1, "o1"),       // 10: o at 90
			keyed(a, 4, "a2"),       // 40 > 30: refused
			keyed(a, 3, "a3"),       // 30: a at 0
			keyed(o, 1, "o1"),       // replays o1
			keyed(missing, 1, "m1"), // no state
		}
		res, errs := b.store.ConsumeBatch(ctx, cmds)
		if len(res) != len(cmds) || len(errs) != len(cmds) {
			t.Fatalf("%d results and %d errors for %d commands", len(res), len(errs), len(cmds))
		}
		for i, tc := range []struct {
			err      error
			balance  int64
			replayed bool
		}{{nil, 30, false}, {nil, 90, false}, {engine.ErrInsufficientCredits, 0, false}, {nil, 0, false},
			{nil, 90, true}, {engine.ErrStateMissing, 0, false}} {
			if !errors.Is(errs[i], tc.err) || (tc.err == nil && errs[i] != nil) {
				t.Errorf("command %d: error %v, want %v", i, errs[i], tc.err)
				continue
			}
			if tc.err != nil {
				continue
			}
			if res[i].Mutation.Account.Balance != tc.balance || res[i].Replayed != tc.replayed {
				t.Errorf("command %d: balance %d replayed %v, want %d %v", i, res[i].Mutation.Account.Balance, res[i].Replayed, tc.balance, tc.replayed)
			}
		}
		if res[4].Mutation.OpID != res[1].Mutation.OpID || res[4].Mutation.CustomerID != o.CustomerID {
			t.Errorf("the repeated key did not replay the first: %v / %v", res[4].Mutation.OpID, res[1].Mutation.OpID)
		}
		// One at a time agrees: a's account moved by exactly the two charges.
		if _, err := b.store.Consume(ctx, consumeCmd(a, 1, perUnitTerms(1), engine.OveragePolicyBlock, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("a should be empty after the batch: %v", err)
		}
	})
}
