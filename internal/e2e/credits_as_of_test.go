package e2e

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

// TestCreditsAsOf (issue 28 item 6): GET .../credits?as_of= answers the
// balance, reserved and pending of a past instant from the ledger, debt of
// the credit line included, on both the id and the external id paths; the
// present instant answers what the plain read does; a malformed as_of is a
// 400 and a future one a 422, both naming as_of. Both walks of the ledger
// (back from the instant, forward to the newest entry) agree, and past
// their bound on both sides the answer is ErrAsOfTooFar.
func TestCreditsAsOf(t *testing.T) {
	clock := newTestClock(time.Now().Add(-time.Hour))
	s := NewStack(t, WithClock(clock))
	tn := s.NewTenant(uniq("asof"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)
	c := a.createCustomer(map[string]any{"external_id": uniq("asof"), "credit_limit_mc": 500})
	id, ext := c["id"].(string), c["external_id"].(string)

	start := clock.Now()
	a.grant(id, map[string]any{"credits": 1000, "metadata": map[string]any{"plan": "p"},
		"expires_at": start.Add(2 * time.Hour).UTC().Format(time.RFC3339Nano)})
	clock.Advance(time.Minute)
	// Stacked after the first block: pending until it ends (and so it pays
	// no debt: docs/rules.md "Credit line").
	a.grant(id, map[string]any{"credits": 700, "stack_after": map[string]any{"metadata_match": map[string]any{"plan": "p"}},
		"duration_seconds": 3600})
	clock.Advance(time.Minute)
	wantStatus(t, a.consumeUnits(id, m, 12), 200, "consume 1200")
	clock.Advance(time.Minute)
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 3, "ttl_seconds": 3600})
	clock.Advance(time.Minute)
	wantStatus(t, a.post("/v1/reservations/"+h["id"].(string)+"/release", nil), 200, "release")
	clock.Advance(time.Minute)

	at := func(d time.Duration) string { return start.Add(d).UTC().Format(time.RFC3339Nano) }
	tests := []struct {
		name                             string
		asOf                             string
		balance, reserved, pending, debt int64
		effective                        int64
	}{
		{"before the first entry", at(-time.Second), 0, 0, 0, 0, 0},
		{"after the grant", at(30 * time.Second), 1000, 0, 0, 0, 1000},
		{"a stacked grant pending", at(90 * time.Second), 1700, 0, 700, 0, 1000},
		{"in debt", at(150 * time.Second), 500, 0, 700, 200, -200},
		{"with a reservation on the line", at(210 * time.Second), 500, 300, 700, 200, -500},
		{"the reservation released", at(270 * time.Second), 500, 0, 700, 200, -200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, path := range []string{"/v1/customers/" + id, "/v1/customer-by-external-id/" + url.PathEscape(ext)} {
				r := a.get(path + "/credits?as_of=" + url.QueryEscape(tt.asOf))
				if !checkStatus(t, r, 200, path+" as_of "+tt.asOf) {
					continue
				}
				b := r.Body
				if Int(t, b["balance"]) != tt.balance || Int(t, b["reserved_balance"]) != tt.reserved ||
					Int(t, b["pending_balance"]) != tt.pending || Int(t, b["debt_mc"]) != tt.debt ||
					Int(t, b["effective_balance"]) != tt.effective {
					t.Errorf("%s as_of %s: %s", path, tt.asOf, r.Raw)
				}
				if got := checkTime(t, b["as_of"], "as_of"); !got.Equal(checkTime(t, tt.asOf, "asked")) {
					t.Errorf("as_of echoed %v, want %s", b["as_of"], tt.asOf)
				}
				if blocks := arr(t, b["blocks"], "blocks"); len(blocks) != 0 {
					t.Errorf("blocks %v, want none in a past answer", blocks)
				}
			}
		})
	}

	t.Run("now answers as the plain read", func(t *testing.T) {
		now := a.credits(id)
		r := a.get("/v1/customers/" + id + "/credits?as_of=" + url.QueryEscape(clock.Now().UTC().Format(time.RFC3339Nano)))
		if checkStatus(t, r, 200, "as_of now") {
			for _, k := range []string{"balance", "reserved_balance", "pending_balance", "effective_balance", "debt_mc", "lifetime_earned"} {
				if Int(t, r.Body[k]) != Int(t, now[k]) {
					t.Errorf("%s: as_of now %v, plain read %v", k, r.Body[k], now[k])
				}
			}
		}
	})

	t.Run("bad as_of", func(t *testing.T) {
		for _, bad := range []string{"yesterday", "2026-13-01T00:00:00Z", "2026-01-01"} {
			checkProblem(t, a.get("/v1/customers/"+id+"/credits?as_of="+url.QueryEscape(bad)), 400, "bad-request", "as_of", bad)
		}
		future := clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		checkProblem(t, a.get("/v1/customers/"+id+"/credits?as_of="+url.QueryEscape(future)), 422, "validation-error", "as_of", "future")
	})

	t.Run("both walks agree, and past both bounds it refuses", func(t *testing.T) {
		s.Drain()
		st := persist.NewStore(s.Pool)
		ctx := context.Background()
		cust := engine.CustomerKey{TenantID: uuid.MustParse(tn.ID), Environment: engine.EnvironmentLive, CustomerID: uuid.MustParse(id)}
		for _, tt := range tests {
			asOf, _ := time.Parse(time.RFC3339Nano, tt.asOf)
			for _, limit := range []int{engine.MaxAsOfEntries, 2} {
				p, err := st.AccountAt(ctx, cust, asOf, limit)
				if errors.Is(err, engine.ErrAsOfTooFar) {
					continue // more than 2 entries on each side
				}
				if err != nil {
					t.Fatal(err)
				}
				if p.Balance != tt.balance || p.Reserved != tt.reserved || p.Debt != tt.debt {
					t.Errorf("%s, walk of %d: %+v", tt.name, limit, p)
				}
			}
		}
		// Three entries before 150 s and two after: a bound of 1 refuses.
		if _, err := st.AccountAt(ctx, cust, start.Add(150*time.Second), 1); !errors.Is(err, engine.ErrAsOfTooFar) {
			t.Errorf("walk of 1 at 150 s: %v, want ErrAsOfTooFar", err)
		}
	})
}
