package engine

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// A reconcile pass (issue 11) compares, for every account Postgres holds,
// the hot store's copy with the system of record once the persister has
// drained: after a Redis failover the promoted replica may lack writes the
// old master made (and the persister stored), so the two can disagree.
// Postgres wins: the ops it holds are durable, and ops only the lost master
// had were never acknowledged when replica acks are on (docs/decisions.md,
// "Reconcile"). With Fix, each diverged customer is reloaded from Postgres,
// fenced on the store version the pass compared.

// Reconcile limits (invariant 11).
const (
	// DefaultReconcilePage is how many accounts one reconcile page reads
	// from each side.
	DefaultReconcilePage = 500
	// DefaultReconcileReported is how many differing customers a report
	// keeps in full; the counts cover all of them.
	DefaultReconcileReported = 20
)

// StoredAccount is one customer's raw state in the hot store, as a reload
// would have written it: the figures no clock changes (balance and pending
// are derived from the blocks at a given instant, so they are not here).
type StoredAccount struct {
	// Present is false when the store holds no state for the customer (it
	// is loaded from Postgres on first use, so that is no difference).
	Present        bool
	AccountID      string
	Version        int64
	Reserved       int64
	LifetimeEarned int64
	// Debt is what the account owes on its credit line (field "d").
	Debt int64
	// Blocks are the blocks with credit left, in no particular order.
	Blocks []MutationBlock
	// Gauges are the gauge counters by metric key (leased slots
	// included); Leases the active leases, in no particular order.
	Gauges map[string]int64
	Leases []StoredLease
	// Budgets are the budget counter fields ("u:..." by name, raw values).
	Budgets map[string]string
}

// ReconcileOptions tune a pass; zero fields take the defaults.
type ReconcileOptions struct {
	// PageSize is how many accounts a page reads (default 500).
	PageSize int
	// Fix reloads each diverged customer from Postgres.
	Fix bool
	// Reported is how many differences the report lists (default 20).
	Reported int
	// Confirm is how long to wait before reading a page's differing
	// customers again: a write in flight (store ahead, persister not yet
	// committed) is no divergence. 0 reads again at once.
	Confirm time.Duration
	// Clock dates the applied operations a reload restores, and is the
	// instant balance and pending are judged at (default system).
	Clock Clock
	// Scope limits the pass to one tenant (and environment); zero: every
	// account.
	Scope ReconcileScope
	// Drained, when set, tells whether the persister has caught up (the
	// outbox is empty). A store ahead of Postgres is then no write in
	// flight but a difference of its own, and Fix reloads it too (fenced
	// above the store's version); without Drained it is left alone.
	Drained func(ctx context.Context) (bool, error)
}

// ReconcileScope is the part of the accounts a pass compares.
type ReconcileScope struct {
	// TenantID limits the pass to one tenant (uuid.Nil: every tenant).
	TenantID uuid.UUID
	// Environment limits it to one environment ("": both).
	Environment Environment
}

// IsZero tells whether the scope is every account.
func (s ReconcileScope) IsZero() bool { return s.TenantID == uuid.Nil && s.Environment == "" }

// Divergence names one way the hot store and Postgres disagree.
type Divergence string

// The divergences a pass reports.
const (
	// DivergenceVersion: the store and Postgres are at different versions.
	DivergenceVersion Divergence = "version"
	// DivergenceBlocks: the blocks with credit left differ (set or amounts).
	DivergenceBlocks Divergence = "blocks"
	// DivergenceReserved: the reserved totals differ.
	DivergenceReserved Divergence = "reserved"
	// DivergenceEarned: lifetime earned differs.
	DivergenceEarned Divergence = "lifetime_earned"
	// DivergenceDebt: the debt of the credit line differs.
	DivergenceDebt Divergence = "debt"
	// DivergenceAccountID: the account ids differ.
	DivergenceAccountID Divergence = "account_id"
	// DivergenceGauges: a gauge counter differs (issue 31 item 5).
	DivergenceGauges Divergence = "gauges"
	// DivergenceLeases: the active gauge leases differ (set, amounts or
	// instants).
	DivergenceLeases Divergence = "leases"
	// DivergenceBudgets: a budget counter's spend in the current period
	// differs from the consumption the ledger holds for it (issue 28 item
	// 3; compared only at equal versions, as a charge moves both).
	DivergenceBudgets Divergence = "budgets"
	// DivergenceLedger: in Postgres itself, the blocks' remaining credit
	// does not equal the sum of the ledger (invariant 1). A reload cannot
	// mend it: it needs an operator.
	DivergenceLedger Divergence = "ledger"
)

// Difference is one customer whose state disagrees.
type Difference struct {
	Customer CustomerKey
	// Kinds are what disagrees, in a fixed order.
	Kinds []Divergence
	// StoreVersion is the hot store's version (-1: no state); PostgresVersion Postgres'.
	StoreVersion, PostgresVersion int64
	// StoreBalance and PostgresBalance sum the blocks' remaining credit;
	// LedgerSum sums the customer's ledger deltas.
	StoreBalance, PostgresBalance, LedgerSum int64
	// Fixed: the reload wrote Postgres' state and a second read agrees.
	Fixed bool
	// Fields are the figures that differ with both values, in a fixed
	// order (account figures, then blocks by id).
	Fields []FieldDifference
}

// FieldDifference is one figure the two stores disagree on, with each
// side's value as text ("absent" for a block one side lacks).
type FieldDifference struct {
	Field    string `json:"field"`
	Redis    string `json:"redis"`
	Postgres string `json:"postgres"`
}

// String is the difference on one line, for the CLI.
func (d Difference) String() string {
	kinds := make([]string, len(d.Kinds))
	for i, k := range d.Kinds {
		kinds[i] = string(k)
	}
	s := fmt.Sprintf("customer %s (tenant %s, %s): %s; store v%d balance %d, postgres v%d balance %d, ledger %d",
		d.Customer.CustomerID, d.Customer.TenantID, d.Customer.Environment, strings.Join(kinds, ","),
		d.StoreVersion, d.StoreBalance, d.PostgresVersion, d.PostgresBalance, d.LedgerSum)
	if d.Fixed {
		s += "; reloaded from postgres"
	}
	return s
}

// ReconcileReport counts what a pass found.
type ReconcileReport struct {
	// Checked counts the accounts Postgres holds that the pass compared.
	Checked int64
	// Equal counts those the store holds with the same state.
	Equal int64
	// NotLoaded counts those the store holds no state for (loaded on use).
	NotLoaded int64
	// Found counts the customers that differed; Fixed those a reload mended.
	Found, Fixed int64
	// First are the first Reported differences, in customer id order.
	First []Difference
	// ByKind counts the differing customers by what differed (one
	// customer counts under each of its kinds).
	ByKind map[Divergence]int64
}

// Remaining is the differences left after the pass (Found - Fixed).
func (r ReconcileReport) Remaining() int64 { return r.Found - r.Fixed }

// Reconcile compares every account of src with store, page by page in
// customer id order (memory bounded by one page), and with opts.Fix
// reloads each diverged customer from Postgres. Run it once the persister
// has drained: a store write not yet persisted is reported unless it
// lands within opts.Confirm.
func Reconcile(ctx context.Context, src ReconcileSource, store ReconcileStore, opts ReconcileOptions) (ReconcileReport, error) {
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultReconcilePage
	}
	if opts.Reported <= 0 {
		opts.Reported = DefaultReconcileReported
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	scoped, _ := src.(ScopedReconcileSource)
	if scoped == nil && !opts.Scope.IsZero() {
		return ReconcileReport{}, fmt.Errorf("engine: reconcile: this source cannot limit a pass to a tenant")
	}
	var rep ReconcileReport
	after := uuid.Nil
	for {
		var states []AccountState
		var err error
		if scoped != nil {
			states, err = scoped.ReconcileStates(ctx, opts.Scope, after, opts.PageSize)
		} else {
			// appliedSince = now: the comparison needs no applied operations.
			states, err = src.AccountStates(ctx, after, opts.PageSize, opts.Clock.Now())
		}
		if err != nil {
			return rep, fmt.Errorf("engine: reconcile: %w", err)
		}
		if len(states) == 0 {
			return rep, nil
		}
		diffs, notLoaded, err := comparePage(ctx, src, store, states, opts.Clock)
		if err != nil {
			return rep, err
		}
		if len(diffs) > 0 {
			if diffs, err = confirm(ctx, src, store, diffs, opts.Confirm, opts.Clock); err != nil {
				return rep, err
			}
		}
		rep.Checked += int64(len(states))
		rep.NotLoaded += notLoaded
		rep.Equal += int64(len(states)) - notLoaded
		for _, d := range diffs {
			if d.StoreVersion >= 0 {
				rep.Equal--
			}
			if opts.Fix {
				if d.Fixed, err = reload(ctx, src, store, d, opts); err != nil {
					return rep, err
				}
			}
			rep.Found++
			if rep.ByKind == nil {
				rep.ByKind = map[Divergence]int64{}
			}
			for _, k := range d.Kinds {
				rep.ByKind[k]++
			}
			if d.Fixed {
				rep.Fixed++
			}
			if len(rep.First) < opts.Reported {
				rep.First = append(rep.First, d)
			}
		}
		if len(states) < opts.PageSize {
			return rep, nil
		}
		after = states[len(states)-1].CustomerID
	}
}

// comparePage reads states' customers from the store and their ledger sums,
// and returns those that differ and how many the store does not hold.
func comparePage(ctx context.Context, src ReconcileSource, store ReconcileStore, states []AccountState, clock Clock) ([]Difference, int64, error) {
	ids := make([]uuid.UUID, len(states))
	for i, st := range states {
		ids[i] = st.CustomerID
	}
	stored, err := store.StoredAccounts(ctx, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("engine: reconcile: read store: %w", err)
	}
	if len(stored) != len(states) {
		return nil, 0, fmt.Errorf("engine: reconcile: %d store accounts for %d customers", len(stored), len(states))
	}
	sums, err := src.LedgerSums(ctx, ids)
	if err != nil {
		return nil, 0, fmt.Errorf("engine: reconcile: ledger sums: %w", err)
	}
	var diffs []Difference
	var notLoaded int64
	for i, st := range states {
		if !stored[i].Present {
			notLoaded++
		}
		if d, ok := CompareAccount(st, stored[i], sums[st.CustomerID]); !ok {
			d.Fields = FieldDifferences(st, stored[i], sums[st.CustomerID], clock.Now().UnixMilli())
			diffs = append(diffs, d)
		}
	}
	return diffs, notLoaded, nil
}

// confirm waits wait, reads the differing customers again from both sides
// and keeps those that still differ.
func confirm(ctx context.Context, src ReconcileSource, store ReconcileStore, diffs []Difference, wait time.Duration, clock Clock) ([]Difference, error) {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	kept := diffs[:0]
	for _, d := range diffs {
		st, ok, err := src.AccountState(ctx, d.Customer, clock.Now())
		if err != nil {
			return nil, fmt.Errorf("engine: reconcile: %w", err)
		}
		if !ok {
			continue
		}
		again, err := compareOne(ctx, src, store, st, clock)
		if err != nil {
			return nil, err
		}
		if again != nil {
			kept = append(kept, *again)
		}
	}
	return kept, nil
}

// compareOne compares one account read from Postgres with the store; nil
// when they agree.
func compareOne(ctx context.Context, src ReconcileSource, store ReconcileStore, st AccountState, clock Clock) (*Difference, error) {
	diffs, _, err := comparePage(ctx, src, store, []AccountState{st}, clock)
	if err != nil || len(diffs) == 0 {
		return nil, err
	}
	return &diffs[0], nil
}

// reload replaces the store's state of d's customer with Postgres', fenced
// on the store version d saw, then compares again; it reports whether the
// two now agree. A Postgres that disagrees with its own ledger is left for
// an operator (loading it would spread the error), and so is a store
// ahead of Postgres (its ops are still on their way) unless opts.Drained
// says the outbox is empty.
func reload(ctx context.Context, src ReconcileSource, store ReconcileStore, d Difference, opts ReconcileOptions) (bool, error) {
	clock := opts.Clock
	for _, k := range d.Kinds {
		if k == DivergenceLedger {
			return false, nil
		}
	}
	if d.StoreVersion > d.PostgresVersion {
		// The store is ahead: its outbox entries are not in Postgres yet
		// (the persister lags, or waits for a replica). A reload would
		// drop ops that may have been acknowledged; the difference stays
		// reported until they land. Once the outbox is empty (read after
		// the comparison), nothing of the store's is on its way: its
		// version was moved behind creditd's back, or its ops were
		// dead-lettered, and Postgres wins.
		if opts.Drained == nil {
			return false, nil
		}
		drained, err := opts.Drained(ctx)
		if err != nil || !drained {
			return false, err
		}
	}
	since := clock.Now().Add(-AppliedRetention)
	st, ok, err := src.AccountState(ctx, d.Customer, since)
	if err != nil || !ok {
		return false, err
	}
	if st.Version != d.PostgresVersion {
		// The persister moved Postgres since: the next pass compares again.
		return false, nil
	}
	if f, ok := src.(ReconcileFencer); ok && d.StoreVersion >= d.PostgresVersion {
		// Same version (or ahead, drained), other state: the store ran a
		// history of its own. Fence it, so an entry of it still in flight
		// is refused, never persisted, and Postgres' version moves above
		// the store's.
		if _, ok, err := f.FenceFork(ctx, d.Customer, d.StoreVersion); err != nil || !ok {
			return false, err
		}
		if st, ok, err = src.AccountState(ctx, d.Customer, since); err != nil || !ok {
			return false, err
		}
	}
	wrote, err := store.Reload(ctx, st, d.StoreVersion)
	if err != nil {
		return false, fmt.Errorf("engine: reconcile: reload %s: %w", d.Customer.CustomerID, err)
	}
	if !wrote {
		return false, nil
	}
	again, err := compareOne(ctx, src, store, st, clock)
	return err == nil && again == nil, err
}
