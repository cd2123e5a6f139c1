package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// oldLowBalanceSQL is the payload the events statement made of a
// credit.low_balance candidate before the rule moved to Go: Go built the
// body without the external id and threshold, and SQL set both in. The
// stored bytes must stay those.
const oldLowBalanceSQL = `SELECT jsonb_set(jsonb_set($1::text::jsonb, '{external_customer_id}',
	COALESCE(to_jsonb($2::text), 'null'::jsonb)), '{data,threshold_mc}', to_jsonb($3::bigint))::text`

// TestLowBalanceDecidedInGo (issue 12 item 5): a debit without a Context
// owes credit.low_balance when it crosses its customer's threshold, else
// its tenant's default; the rule is engine.LowBalanceCrossed on the
// thresholds Apply reads, and the stored body is byte for byte the one the
// SQL predicate and jsonb_set made.
func TestLowBalanceDecidedInGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cases := []struct {
		name       string
		customer   *int64
		tenant     int64
		after      int64
		wantLow    bool
		wantThresh int64
	}{
		{"customer threshold crossed", ptr(int64(300)), 0, 200, true, 300},
		{"tenant default crossed", nil, 500, 200, true, 500},
		{"customer threshold wins over default", ptr(int64(100)), 500, 200, false, 0},
		{"no threshold", nil, 0, 0, false, 0},
		{"landing on the threshold is no crossing", ptr(int64(200)), 0, 200, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			live, _ := b.tenant(t)
			if tc.tenant > 0 {
				tn, err := b.store.GetTenant(b.ctx, live.TenantID)
				if err != nil {
					t.Fatal(err)
				}
				tn.DefaultLowBalanceThresholdMC = tc.tenant
				if err := b.store.UpdateTenant(b.ctx, tn); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Now().UTC().Truncate(time.Millisecond)
			cust := engine.Customer{ID: uuid.New(), TenantID: live.TenantID, Environment: live.Environment,
				ExternalID: "ext-" + uuid.NewString(), LowBalanceThresholdMC: tc.customer, Metadata: engine.Metadata{},
				CreatedAt: now, UpdatedAt: now}
			if err := b.store.CreateCustomer(b.ctx, cust); err != nil {
				t.Fatal(err)
			}
			src := engine.SourceManual
			debit := engine.Mutation{TenantID: live.TenantID, CustomerID: cust.ID, Environment: live.Environment,
				AtMS: now.UnixMilli(), OpID: uuid.New(), Kind: engine.MutationDebit, IdempotencyKey: "d"}
			debit.Account = engine.MutationAccount{ID: uuid.NewString(), Version: 2, Balance: tc.after, LifetimeEarned: 1000}
			debit.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: tc.after - 1000,
				Type: engine.EntryAdjustment, Source: &src}}
			if err := b.store.Apply(b.ctx, []engine.Mutation{debit}); err != nil {
				t.Fatal(err)
			}
			var low *engine.Event
			for _, e := range b.events(t, live.TenantID) {
				if e.EventType == engine.EventCreditLowBalance {
					low = &e
				}
			}
			if (low != nil) != tc.wantLow {
				t.Fatalf("credit.low_balance stored: %v, want %v", low != nil, tc.wantLow)
			}
			if low == nil {
				return
			}
			candidate, ok := engine.LowBalanceEvent(debit, 1000)
			if !ok {
				t.Fatal("the debit is no candidate")
			}
			var old string
			if err := b.pool.QueryRow(b.ctx, oldLowBalanceSQL, string(candidate.Payload), cust.ExternalID,
				tc.wantThresh).Scan(&old); err != nil {
				t.Fatal(err)
			}
			if want := sequencedPayload(*low.Sequence, old); string(low.Payload) != want {
				t.Fatalf("stored body\n%s\nwant the SQL rule's\n%s", low.Payload, want)
			}
		})
	}
}
