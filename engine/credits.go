package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Grant and adjust limits (docs/spec/interface.md Credits and Limits).
const (
	MaxDurationSeconds = 315360000
	MaxPriority        = 255
	// AppliedRetention is how far back a load reads a customer's applied
	// operations (AccountState.Applied). Redis no longer gets op keys from
	// them (Postgres answers retries, AppliedOps); the persist reader still
	// derives its finalized-holds cutoff from it.
	AppliedRetention = 7 * 24 * time.Hour
)

// Credits grants, adjusts and reads customers' credit. Money moves only
// through the BlockStore (atomic Lua); reads of history come from Postgres.
type Credits struct {
	customers *Customers
	// lookup resolves the customer of a grant, an adjust and a balance
	// read: the hot path's cache (WithLookup), so they keep answering from
	// Redis while Postgres is down (invariant 16); customers when nil.
	lookup CustomerResolver
	blocks BlockStore
	ledger LedgerReader
	clock  Clock
	loads  singleLoad
	// behind gives the reads Postgres answers read-your-writes (nil: none).
	behind *WrittenBehind
	// reloads counts state loads from Postgres (after a NOSTATE reply or
	// for a sweep), for the creditd_nostate_reloads_total metric.
	reloads atomic.Uint64
}

// NewCredits returns the credit service; behind (may be nil) makes its
// ledger reads wait for the writes acknowledged before them.
func NewCredits(customers *Customers, blocks BlockStore, ledger LedgerReader, clock Clock, behind *WrittenBehind) *Credits {
	return &Credits{customers: customers, blocks: blocks, ledger: ledger, clock: clock, behind: behind}
}

// WithLookup makes grants, adjusts and balance reads resolve their
// customer through l (internal/app: the CachedCustomers the checks and
// consumes use) instead of the directory, so that a customer whose state
// is in Redis keeps them answering while Postgres is down (issue 26 item
// 3). l must see this service's customer writes (their forgetting
// directory) at once.
func (s *Credits) WithLookup(l CustomerResolver) *Credits {
	s.lookup = l
	return s
}

// resolver is what grants, adjusts and balance reads resolve through.
func (s *Credits) resolver() CustomerResolver {
	if s.lookup != nil {
		return s.lookup
	}
	return s.customers
}

// WrittenBehind is the read-your-writes wait the services built on Credits
// share (nil: none).
func (s *Credits) WrittenBehind() *WrittenBehind { return s.behind }

// Reloads is how many times this process loaded a customer's state from
// Postgres into the block store because the store had none (NOSTATE).
func (s *Credits) Reloads() uint64 { return s.reloads.Load() }

// Idempotency names the HTTP idempotency key of a request and the
// fingerprint of its body.
type Idempotency struct {
	Key         string
	RequestHash string
	// CheckedAt is when (wall clock) a Postgres look-up found no operation
	// under Key (a usage batch looks its events up at once); zero when
	// none was made.
	CheckedAt time.Time
}

// AccountSummary is the account member of grant and adjust responses.
type AccountSummary struct {
	CustomerID       uuid.UUID `json:"customer_id"`
	Balance          int64     `json:"balance"`
	ReservedBalance  int64     `json:"reserved_balance"`
	PendingBalance   int64     `json:"pending_balance"`
	EffectiveBalance int64     `json:"effective_balance"`
	LifetimeEarned   int64     `json:"lifetime_earned"`
	Version          int64     `json:"version"`
}

const minInt64 = -1 << 63

// Account reads a customer's balance snapshot; it never creates a customer.
func (s *Credits) Account(ctx context.Context, scope Scope, ref CustomerRef, includeBlocks bool) (Account, error) {
	c, err := s.resolver().Resolve(ctx, scope, ref, false)
	if err != nil {
		return Account{}, err
	}
	key := CustomerKeyOf(c)
	var acct Account
	_, err = withLoad(ctx, s, key, func() (MutationResult, error) {
		var e error
		acct, e = s.blocks.Snapshot(ctx, key, s.clock.Now())
		return MutationResult{}, e
	})
	if err != nil {
		return Account{}, err
	}
	acct.TenantID, acct.CustomerID, acct.Environment = c.TenantID, c.ID, c.Environment
	acct.CreditLimitMC = c.CreditLimitMC
	if r, ok := s.blocks.(BudgetCounterReader); ok && len(c.Budgets) > 0 {
		// Read after the snapshot, which loaded the state if it was missing.
		if acct.Budgets, err = budgetStatuses(ctx, r, key, c.Budgets, s.clock.Now()); err != nil {
			return Account{}, err
		}
	}
	acct.ParentID = c.ParentID
	if r, ok := s.blocks.(BudgetCounterReader); ok && c.ParentID != nil && c.ParentDrawLimit != nil {
		vals, err := r.BudgetCounters(ctx, key, []string{c.ParentDrawLimit.Field()})
		if err != nil {
			return Account{}, err
		}
		cnt, ok := ParseBudgetCounter(vals[0])
		st := DrawLimitStatusOf(*c.ParentDrawLimit, cnt, ok, s.clock.Now())
		acct.ParentDraw = &st
	}
	if !includeBlocks || acct.Blocks == nil {
		acct.Blocks = []Block{}
	}
	return acct, nil
}

// Load installs one customer's state from Postgres into the block store; the
// store's version fence makes a stale load harmless.
func (s *Credits) Load(ctx context.Context, c CustomerKey) error {
	return s.loads.do(c.CustomerID, func() error {
		s.reloads.Add(1)
		now := s.clock.Now()
		st, ok, err := s.ledger.AccountState(ctx, c, now.Add(-AppliedRetention))
		if err != nil {
			return err
		}
		if !ok {
			st = AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}
		}
		_, err = s.blocks.Load(ctx, st)
		return err
	})
}

// withLoad runs op, and once more after loading the customer from Postgres
// when the block store has no state for it.
func withLoad(ctx context.Context, s *Credits, c CustomerKey, op func() (MutationResult, error)) (MutationResult, error) {
	res, err := op()
	if !errors.Is(err, ErrStateMissing) {
		return res, err
	}
	if err := s.Load(ctx, c); err != nil {
		return MutationResult{}, err
	}
	return op()
}

// now is the service's clock reading, for the services that act through it.
func (s *Credits) now() time.Time { return s.clock.Now() }

// grant runs cmd, loading the customer first when the store has no state.
func (s *Credits) grant(ctx context.Context, cmd GrantCommand) (MutationResult, error) {
	return withLoad(ctx, s, cmd.Customer, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
}

// grantNewCustomer runs cmds on c, a customer created just now, in one
// batch when the block store batches.
func (s *Credits) grantNewCustomer(ctx context.Context, c Customer, cmds []GrantCommand) error {
	one := func(cmd GrantCommand) error {
		_, err := s.grant(ctx, cmd)
		return err
	}
	if len(cmds) == 0 {
		return nil
	}
	bg, ok := s.blocks.(BatchGranter)
	if !ok {
		for _, cmd := range cmds {
			if err := one(cmd); err != nil {
				return err
			}
		}
		return nil
	}
	// Postgres has nothing to rebuild: install the empty state (version 0
	// only creates a missing hash) and send every block in one batch.
	if _, err := s.blocks.Load(ctx, AccountState{TenantID: c.TenantID, CustomerID: c.ID, Environment: c.Environment}); err != nil {
		return err
	}
	for j, err := range bg.GrantBatch(ctx, cmds) {
		if errors.Is(err, ErrStateMissing) {
			// The state went away mid-import (a flush): load and retry.
			err = one(cmds[j])
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// balancesAt reads the customer's figures as of now: the store's lean read
// when it has one (no blocks decoded), else a Snapshot. Errors:
// ErrStateMissing.
func (s *Credits) balancesAt(ctx context.Context, key CustomerKey, now time.Time) (Balances, error) {
	if br, ok := s.blocks.(BalanceReader); ok {
		return br.Balances(ctx, key, now)
	}
	acct, err := s.blocks.Snapshot(ctx, key, now)
	return Balances{Balance: acct.Balance, Reserved: acct.ReservedBalance, Pending: acct.PendingBalance, Effective: acct.EffectiveBalance,
		Debt: acct.DebtMC}, err
}

// snapshotAt reads the customer's account as of now, loading it first
// when the store has no state.
func (s *Credits) snapshotAt(ctx context.Context, key CustomerKey, now time.Time) (Account, error) {
	var acct Account
	_, err := withLoad(ctx, s, key, func() (MutationResult, error) {
		var e error
		acct, e = s.blocks.Snapshot(ctx, key, now)
		return MutationResult{}, e
	})
	return acct, err
}

// resolve finds the customer of ref in scope, never creating one.
func (s *Credits) resolve(ctx context.Context, scope Scope, ref CustomerRef) (Customer, error) {
	return s.customers.Resolve(ctx, scope, ref, false)
}

// singleLoad lets one goroutine per customer load while the others wait for
// its result (one loader at a time per customer, issue 2 scope 8).
type singleLoad struct {
	mu       sync.Mutex
	inFlight map[uuid.UUID]*loadCall
}

type loadCall struct {
	done chan struct{}
	err  error
}

func (l *singleLoad) do(id uuid.UUID, fn func() error) error {
	l.mu.Lock()
	if l.inFlight == nil {
		l.inFlight = map[uuid.UUID]*loadCall{}
	}
	if c, ok := l.inFlight[id]; ok {
		l.mu.Unlock()
		<-c.done
		return c.err
	}
	c := &loadCall{done: make(chan struct{})}
	l.inFlight[id] = c
	l.mu.Unlock()
	c.err = fn()
	l.mu.Lock()
	delete(l.inFlight, id)
	l.mu.Unlock()
	close(c.done)
	return c.err
}

func summary(m Mutation) AccountSummary {
	a := m.Account
	return AccountSummary{
		CustomerID: m.CustomerID, Balance: a.Balance, ReservedBalance: a.Reserved,
		PendingBalance: a.Pending, EffectiveBalance: a.Balance - a.Reserved - a.Pending,
		LifetimeEarned: a.LifetimeEarned, Version: a.Version,
	}
}

// awaitPersisted gives a read of c that Postgres answers read-your-writes
// on any node (WrittenBehind).
func (s *Credits) awaitPersisted(ctx context.Context, c CustomerKey) {
	s.behind.Customer(ctx, c.CustomerID)
}
