package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestApplyAlertEventsOnce (issue 15 item 4, invariant 3): the alert
// events of a batch are stored with it exactly once, however often the
// batch is replayed (lean write, ON CONFLICT write, a late replay of one
// Mutation after newer ones), numbered without a gap; the stored state never
// goes back to an older version, so the threshold re-arms on the later
// grant and fires again on the next crossing, while the top-up rule stays
// within its dedupe window. A tenant without settings costs no subject read.
func TestApplyAlertEventsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	cust := engine.Customer{ID: uuid.New(), TenantID: live.TenantID, Environment: live.Environment, ExternalID: "acme-alerts",
		Metadata: engine.Metadata{}, CreatedAt: now, UpdatedAt: now}
	if err := b.store.CreateCustomer(b.ctx, cust); err != nil {
		t.Fatal(err)
	}
	src := engine.SourceManual
	accountID := uuid.NewString()
	version := int64(0)
	next := func(kind engine.MutationKind, delta, balance int64, at time.Time) engine.Mutation {
		version++
		return engine.Mutation{OpID: uuid.New(), Kind: kind, TenantID: live.TenantID, CustomerID: cust.ID,
			Environment: live.Environment, AtMS: at.UnixMilli(),
			Account: engine.MutationAccount{ID: accountID, Version: version, Balance: balance, LifetimeEarned: 5000},
			Entries: []engine.MutationEntry{{Role: engine.RoleMain, Delta: delta, Type: engine.EntryAdjustment, Source: &src}}}
	}
	grant := next(engine.MutationGrant, 1000, 1000, now)
	debit := next(engine.MutationDebit, -800, 200, now)

	// No settings yet: nothing to evaluate, no subject read.
	if out, err := b.store.alertsOf(b.ctx, b.pool, []engine.Mutation{grant, debit}); err != nil || out != nil {
		t.Fatalf("alertsOf without settings = %v, %v; want nil", out, err)
	}
	settings := engine.AlertSettings{
		Thresholds: []engine.AlertThreshold{{Type: engine.ThresholdAbsolute, AmountMC: ptr(int64(500))}},
		Topup:      &engine.TopupRule{BelowMC: 500, AmountMC: 2000, DedupeWindowSeconds: 3600}}
	if err := b.store.AlertSettingsPut(b.ctx, live, &cust.ID, settings, now); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.store.AlertSettingsGet(b.ctx, live, &cust.ID)
	if err != nil || !ok || len(got.Settings.Thresholds) != 1 || got.Settings.Topup == nil || got.Settings.Topup.AmountMC != 2000 {
		t.Fatalf("AlertSettingsGet = %+v, %v, %v", got, ok, err)
	}

	for range 2 {
		if err := b.store.Apply(b.ctx, []engine.Mutation{grant, debit}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.pipelinedApply(b.ctx, []engine.Mutation{debit}, nil); err != nil {
		t.Fatal(err)
	}
	count := func(typ engine.EventType) int {
		n := 0
		for _, e := range b.events(t, live.TenantID) {
			if e.EventType == typ {
				n++
			}
		}
		return n
	}
	if c, u := count(engine.EventCreditThresholdCrossed), count(engine.EventCreditTopupRequested); c != 1 || u != 1 {
		t.Fatalf("after replays: %d crossings, %d topup requests; want 1 and 1", c, u)
	}

	// Lifted above (re-armed), a late replay of the debit, then down again
	// ten minutes later: the threshold fires, the top-up rule is deduplicated.
	lift := next(engine.MutationGrant, 1000, 1200, now.Add(time.Minute))
	if err := b.store.Apply(b.ctx, []engine.Mutation{lift}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Apply(b.ctx, []engine.Mutation{debit}); err != nil {
		t.Fatal(err)
	}
	again := next(engine.MutationDebit, -900, 300, now.Add(10*time.Minute))
	if err := b.store.Apply(b.ctx, []engine.Mutation{again}); err != nil {
		t.Fatal(err)
	}
	if c, u := count(engine.EventCreditThresholdCrossed), count(engine.EventCreditTopupRequested); c != 2 || u != 1 {
		t.Fatalf("after the second crossing: %d crossings, %d topup requests; want 2 and 1", c, u)
	}
	var stateVersion, stateBalance int64
	if err := b.pool.QueryRow(b.ctx, `SELECT account_version, balance_mc FROM credit_alert_states WHERE customer_id = $1`,
		cust.ID).Scan(&stateVersion, &stateBalance); err != nil {
		t.Fatal(err)
	}
	if stateVersion != again.Account.Version || stateBalance != 300 {
		t.Fatalf("state version %d balance %d, want %d and 300", stateVersion, stateBalance, again.Account.Version)
	}
	checkSequences(t, b, live.TenantID)

	// Removing the settings stops the events.
	if ok, err := b.store.AlertSettingsDelete(b.ctx, live, cust.ID); err != nil || !ok {
		t.Fatalf("AlertSettingsDelete = %v, %v", ok, err)
	}
	lift2 := next(engine.MutationGrant, 1000, 1300, now.Add(2*time.Hour))
	down := next(engine.MutationDebit, -1200, 100, now.Add(2*time.Hour))
	if err := b.store.Apply(b.ctx, []engine.Mutation{lift2, down}); err != nil {
		t.Fatal(err)
	}
	if c := count(engine.EventCreditThresholdCrossed); c != 2 {
		t.Fatalf("after delete: %d crossings, want still 2", c)
	}
}
