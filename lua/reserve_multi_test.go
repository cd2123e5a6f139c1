package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// multiReserveCmd is a multi-metric reservation of items for c, an hour long.
func multiReserveCmd(c engine.CustomerKey, items ...engine.ReserveLine) engine.ReserveCommand {
	cmd := reserveCmd(c, 0, engine.RuleTerms{}, time.Hour, t0)
	cmd.Metric, cmd.Items = "", items
	return cmd
}

// multiCommitCmd settles reservation with the actual units of each of its items
// (in order), at terms.
func multiCommitCmd(c engine.CustomerKey, reservation engine.MutationReservation, actual []int64, terms []engine.RuleTerms) engine.CommitCommand {
	cmd := commitCmd(c, reservation.ID, 0, engine.RuleTerms{}, t0.Add(time.Minute))
	for i, it := range reservation.Items {
		cmd.Items = append(cmd.Items, engine.CommitLine{Metric: it.BillableMetricKey, EstimatedUnits: it.EstimatedUnits,
			EstimatedCost: it.EstimatedCost, ActualUnits: actual[i], Terms: terms[i]})
	}
	return cmd
}

// TestReserveMulti: reserve_multi.lua holds the items' summed estimated
// cost (metric "", the items in res.items, a reservation entry naming no
// metric), refuses the whole reservation when the effective balance cannot cover
// the sum, and replays; release.lua returns it all.
func TestReserveMulti(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t) // 100
		cmd := multiReserveCmd(c, engine.ReserveLine{Metric: "api.calls", EstimatedUnits: 3, Terms: perUnitTerms(10)},
			engine.ReserveLine{Metric: "gpu.seconds", EstimatedUnits: 1, Terms: flatTerms(20)})
		cmd.IdempotencyKey, cmd.RequestHash = "hold-1", "h1"
		res, err := b.store.Reserve(ctx, cmd)
		if err != nil {
			t.Fatalf("reserve: %v", err)
		}
		m := res.Mutation
		r := m.Reservation
		want := `[{api.calls 3 30 <nil> <nil>} {gpu.seconds 1 20 <nil> <nil>}]`
		if r == nil || r.Metric != "" || r.EstimatedUnits != 4 || r.EstimatedCost != 50 || fmt.Sprint(r.Items) != want ||
			m.Account.Reserved != 50 || m.Account.Balance != 100 {
			t.Fatalf("reservation %+v account %+v", r, m.Account)
		}
		if e := m.Entries[len(m.Entries)-1]; e.Type != engine.EntryReservation || e.Metric != nil || e.Delta != 0 {
			t.Errorf("entry %+v", e)
		}
		// The index describes the reservation's items, so a commit prices them
		// without Postgres.
		if h, ok, err := b.store.ReservationRef(ctx, r.ID); err != nil || !ok || h.Customer != c || !h.Described ||
			h.Metric != "" || fmt.Sprint(h.Items) != want {
			t.Errorf("reservation reservation: %+v %v %v", h, ok, err)
		}
		again := cmd
		again.OpID = uuid.New()
		r2, err := b.store.Reserve(ctx, again)
		if err != nil || !r2.Replayed || fmt.Sprint(r2.Mutation.Reservation.Items) != want {
			t.Errorf("replay: %v %+v", err, r2)
		}
		// 50 free: a second reservation of 30 + 21 is refused whole.
		before := b.reservationDump(t, c)
		big := multiReserveCmd(c, engine.ReserveLine{Metric: "api.calls", EstimatedUnits: 3, Terms: perUnitTerms(10)},
			engine.ReserveLine{Metric: "gpu.seconds", EstimatedUnits: 1, Terms: flatTerms(21)})
		if _, err := b.store.Reserve(ctx, big); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("over the balance: %v", err)
		}
		if after := b.reservationDump(t, c); withoutOutbox(after) != withoutOutbox(before) {
			t.Errorf("refused reservation changed state:\n%s\n->\n%s", before, after)
		}
		rel, err := b.store.Release(ctx, releaseCmd(c, r.ID, false, t0.Add(time.Minute)))
		if err != nil {
			t.Fatalf("release: %v", err)
		}
		rm := rel.Mutation
		if e := rm.Entries[len(rm.Entries)-1]; e.Type != engine.EntryRelease || e.Metric != nil ||
			rm.Account.Reserved != 0 || rm.Reservation.Released != 50 || rm.Reservation.Status != engine.ReservationReleased {
			t.Errorf("release %+v %+v", e, rm.Reservation)
		}
	})
}

// TestCommitMulti: commit_multi.lua prices each item at its own terms and
// charges the total once (one consumption entry, no metric, its metadata
// listing the items), within reservation plus free balance under block (else
// nothing changes), the rest as overage under allow; all-zero units return
// the reservation with a release entry; estimates that do not add up to the reservation
// or a single-metric reservation are refused; a retry replays.
func TestCommitMulti(t *testing.T) {
	t.Parallel()
	items := []engine.ReserveLine{{Metric: "api.calls", EstimatedUnits: 3, Terms: perUnitTerms(10)},
		{Metric: "gpu.seconds", EstimatedUnits: 1, Terms: flatTerms(20)}} // holds 50 of 100
	terms := []engine.RuleTerms{perUnitTerms(10), flatTerms(20)}
	cases := []struct {
		name    string
		policy  engine.OveragePolicy
		actual  []int64
		wantErr error
		// want: the last entry as draws renders it, the charge and cost
		wantEntry     string
		charged, cost int64
	}{
		{"within reservation plus free", engine.OveragePolicyBlock, []int64{5, 1}, nil, "-:-70[b1:60 b2:10]", 70, 70},
		{"one item unused", engine.OveragePolicyBlock, []int64{0, 1}, nil, "b1:-20", 20, 20},
		{"past reservation plus free under block", engine.OveragePolicyBlock, []int64{9, 1}, engine.ErrInsufficientCredits, "", 0, 0},
		{"past reservation plus free under allow", engine.OveragePolicyAllow, []int64{9, 1}, nil, "-:-100/o10[b1:60 b2:40]", 100, 110},
		{"all zero", engine.OveragePolicyBlock, []int64{0, 0}, nil, "", 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				ctx := context.Background()
				c, ids := b.funded(t)
				names := map[uuid.UUID]string{ids[0]: "b1", ids[1]: "b2"}
				reservation := b.reserve(t, multiReserveCmd(c, items...)).Reservation
				cmd := multiCommitCmd(c, *reservation, tc.actual, terms)
				cmd.Context.Policy = tc.policy
				cmd.IdempotencyKey, cmd.RequestHash = "commit-1", "h1"
				cmd.Metadata = engine.Metadata{"job": json.RawMessage(`"j1"`)}
				before := b.reservationDump(t, c)
				res, err := b.store.Commit(ctx, cmd)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err %v, want %v", err, tc.wantErr)
					}
					if after := b.reservationDump(t, c); withoutOutbox(after) != withoutOutbox(before) {
						t.Errorf("refused commit changed state:\n%s\n->\n%s", before, after)
					}
					return
				}
				if err != nil {
					t.Fatalf("commit: %v", err)
				}
				m := res.Mutation
				r := m.Reservation
				if r.Status != engine.ReservationCommitted || m.Account.Reserved != 0 || m.Account.Balance != 100-tc.charged ||
					*r.ActualCost != tc.cost || len(r.Items) != 2 || *r.Items[0].ActualUnits != tc.actual[0] ||
					r.Items[1].EstimatedCost != 20 {
					t.Fatalf("reservation %+v account %+v", r, m.Account)
				}
				e := m.Entries[len(m.Entries)-1]
				if tc.wantEntry == "" {
					if e.Type != engine.EntryRelease || e.Metric != nil || m.Usage != nil {
						t.Errorf("all-zero commit: entry %+v usage %+v", e, m.Usage)
					}
					return
				}
				if got := draws(m, names); got[len(got)-1] != tc.wantEntry {
					t.Errorf("entries %v, want last %s", got, tc.wantEntry)
				}
				var wantItems []engine.UsageItem
				for i, it := range r.Items {
					wantItems = append(wantItems, engine.UsageItem{Metric: it.BillableMetricKey, Units: tc.actual[i], Cost: *it.ActualCost})
				}
				wantMeta, _ := json.Marshal(wantItems)
				if e.Type != engine.EntryConsumption || e.Metric != nil || e.Units != nil ||
					string(e.Metadata) != `{"items":`+string(wantMeta)+`}` {
					t.Errorf("entry %+v meta %s", e, e.Metadata)
				}
				u := m.Usage
				if u == nil || u.Metric != "" || u.Cost != tc.cost || u.Charged != tc.charged || u.ReservationID == nil ||
					fmt.Sprint(u.Items) != fmt.Sprint(wantItems) {
					t.Errorf("usage %+v", u)
				}
				if string(r.Metadata) != `{"job":"j1"}` {
					t.Errorf("reservation metadata %s", r.Metadata)
				}
				again := cmd
				again.OpID = uuid.New()
				r2, err := b.store.Commit(ctx, again)
				if err != nil || !r2.Replayed || r2.Mutation.OpID != cmd.OpID {
					t.Errorf("replay: %v %+v", err, r2)
				}
			})
		})
	}

	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		reservation := b.reserve(t, multiReserveCmd(c, items...)).Reservation
		off := multiCommitCmd(c, *reservation, []int64{1, 1}, terms)
		off.Items[1].EstimatedCost = 21
		single := b.reserve(t, reserveCmd(c, 1, flatTerms(5), time.Hour, t0)).Reservation
		onSingle := multiCommitCmd(c, *reservation, []int64{1, 1}, terms)
		onSingle.ReservationID = single.ID
		for name, cmd := range map[string]engine.CommitCommand{
			"estimates off the reservation":      off,
			"items on a single reservation":      onSingle,
			"single form on a multi reservation": commitCmd(c, reservation.ID, 1, flatTerms(1), t0.Add(time.Minute)),
		} {
			before := b.reservationDump(t, c)
			if _, err := b.store.Commit(ctx, cmd); err == nil {
				t.Errorf("%s: committed", name)
			}
			if after := b.reservationDump(t, c); after != before {
				t.Errorf("%s changed state", name)
			}
		}
	})
}
