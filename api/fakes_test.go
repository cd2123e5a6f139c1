package api

import (
	"bytes"
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// The fakes below stand in for Postgres and Redis so the handler can be
// driven end to end in memory; full-stack tests live elsewhere.

// fakeClock is a fixed, movable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// fakeDirectory is engine.Directory over maps.
type fakeDirectory struct {
	mu        sync.Mutex
	tenants   map[uuid.UUID]engine.Tenant
	keys      map[string]engine.APIKey // by hex hash
	customers map[uuid.UUID]engine.Customer
	order     []uuid.UUID // creation order of customers
	// keyLookups counts APIKeyByHash calls (the auth path's queries).
	keyLookups atomic.Int64
}

func newFakeDirectory() *fakeDirectory {
	return &fakeDirectory{
		tenants:   map[uuid.UUID]engine.Tenant{},
		keys:      map[string]engine.APIKey{},
		customers: map[uuid.UUID]engine.Customer{},
	}
}

func (d *fakeDirectory) CreateTenant(_ context.Context, t engine.Tenant) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.tenants[t.ID] = t
	return nil
}

func (d *fakeDirectory) GetTenant(_ context.Context, id uuid.UUID) (engine.Tenant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	t, ok := d.tenants[id]
	if !ok {
		return engine.Tenant{}, engine.ErrNotFound
	}
	return t, nil
}

func (d *fakeDirectory) UpdateTenant(_ context.Context, t engine.Tenant) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.tenants[t.ID]; !ok {
		return engine.ErrNotFound
	}
	d.tenants[t.ID] = t
	return nil
}

func (d *fakeDirectory) CreateAPIKey(_ context.Context, k engine.APIKey, hash []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.keys[string(hash)] = k
	return nil
}

func (d *fakeDirectory) APIKeyByHash(_ context.Context, hash []byte) (engine.APIKey, error) {
	d.keyLookups.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	k, ok := d.keys[string(hash)]
	if !ok || k.RevokedAt != nil {
		return engine.APIKey{}, engine.ErrNotFound
	}
	return k, nil
}

func (d *fakeDirectory) RevokeAPIKey(_ context.Context, tenant, key uuid.UUID, at time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for h, k := range d.keys {
		if k.ID == key && k.TenantID == tenant && k.RevokedAt == nil {
			k.RevokedAt = &at
			d.keys[h] = k
			return nil
		}
	}
	return engine.ErrNotFound
}

func (d *fakeDirectory) ListTenants(_ context.Context, after uuid.UUID, limit int) ([]engine.Tenant, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []engine.Tenant
	for _, t := range d.tenants {
		if bytes.Compare(t.ID[:], after[:]) > 0 {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].ID[:], out[j].ID[:]) < 0 })
	return out[:min(limit, len(out))], nil
}

func (d *fakeDirectory) ListAPIKeys(_ context.Context, tenant uuid.UUID) ([]engine.APIKey, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []engine.APIKey
	for _, k := range d.keys {
		if k.TenantID == tenant {
			k.Key = ""
			out = append(out, k)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

func (d *fakeDirectory) CreateCustomer(_ context.Context, c engine.Customer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.customers {
		if o.DeletedAt == nil && o.TenantID == c.TenantID && o.Environment == c.Environment && o.ExternalID == c.ExternalID {
			return engine.ErrExternalIDTaken
		}
	}
	d.customers[c.ID] = c
	d.order = append(d.order, c.ID)
	return nil
}

func (d *fakeDirectory) UpdateCustomer(_ context.Context, c engine.Customer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.customers[c.ID] = c
	return nil
}

func (d *fakeDirectory) DeleteCustomer(_ context.Context, s engine.Scope, id uuid.UUID, at time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.customers[id]
	if !ok || c.DeletedAt != nil || c.TenantID != s.TenantID {
		return engine.ErrNotFound
	}
	c.DeletedAt = &at
	d.customers[id] = c
	return nil
}

func (d *fakeDirectory) CustomerByExternalID(_ context.Context, s engine.Scope, ext string) (engine.Customer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.customers {
		if c.DeletedAt == nil && c.TenantID == s.TenantID && c.Environment == s.Environment && c.ExternalID == ext {
			return c, nil
		}
	}
	return engine.Customer{}, engine.ErrNotFound
}

func (d *fakeDirectory) CustomerByID(_ context.Context, id uuid.UUID) (engine.Customer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.customers[id]
	if !ok || c.DeletedAt != nil {
		return engine.Customer{}, engine.ErrNotFound
	}
	return c, nil
}

// HasChildren reports whether a live customer of s names id as its parent.
func (d *fakeDirectory) HasChildren(_ context.Context, s engine.Scope, id uuid.UUID) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.customers {
		if c.DeletedAt == nil && c.TenantID == s.TenantID && c.Environment == s.Environment && c.ParentID != nil && *c.ParentID == id {
			return true, nil
		}
	}
	return false, nil
}

// ListCustomers pages newest first; the cursor is the index to start at.
func (d *fakeDirectory) ListCustomers(_ context.Context, s engine.Scope, search, cursor string, limit int) (engine.Page[engine.Customer], error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var all []engine.Customer
	for i := len(d.order) - 1; i >= 0; i-- {
		c := d.customers[d.order[i]]
		if c.DeletedAt != nil || c.TenantID != s.TenantID || c.Environment != s.Environment {
			continue
		}
		if search != "" && !strings.Contains(c.ExternalID, search) {
			continue
		}
		all = append(all, c)
	}
	start := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 || n > len(all) {
			return engine.Page[engine.Customer]{}, engine.BadRequest("cursor", "cursor is invalid")
		}
		start = n
	}
	end := min(start+limit, len(all))
	p := engine.Page[engine.Customer]{Data: all[start:end], HasMore: end < len(all)}
	if p.HasMore {
		p.NextCursor = strconv.Itoa(end)
	}
	return p, nil
}

// fakeBlocks is engine.BlockStore over maps: every customer has state, so
// the load path never runs. Delay slows Grant to widen race windows.
type fakeBlocks struct {
	mu       sync.Mutex
	accounts map[uuid.UUID]*fakeAccount
	// ops is what the scripts' op keys remember: each applied idempotency
	// key of a customer and its result, so a retry replays.
	ops    map[string]engine.MutationResult
	grants atomic.Int64
	delay  time.Duration
	ledger *fakeLedger
	// fail, when set, is what Grant returns (a store outage).
	fail error
}

type fakeAccount struct {
	id       string
	version  int64
	lifetime int64
	blocks   []engine.MutationBlock
}

func (f *fakeBlocks) account(c engine.CustomerKey) *fakeAccount {
	a, ok := f.accounts[c.CustomerID]
	if !ok {
		a = &fakeAccount{}
		f.accounts[c.CustomerID] = a
	}
	return a
}

func (f *fakeBlocks) mutation(kind engine.MutationKind, op uuid.UUID, c engine.CustomerKey, key, hash string, now time.Time, a *fakeAccount) engine.Mutation {
	var bal int64
	for _, b := range a.blocks {
		bal += b.Remaining
	}
	return engine.Mutation{
		OpID: op, Kind: kind, TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
		IdempotencyKey: key, RequestHash: hash, AtMS: now.UnixMilli(),
		Account: engine.MutationAccount{ID: a.id, Version: a.version, Balance: bal, LifetimeEarned: a.lifetime},
	}
}

func (f *fakeBlocks) Grant(_ context.Context, cmd engine.GrantCommand) (engine.MutationResult, error) {
	if f.fail != nil {
		return engine.MutationResult{}, f.fail
	}
	if res, ok := f.replay(cmd.Customer, cmd.IdempotencyKey); ok {
		return res, nil
	}
	f.grants.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.account(cmd.Customer)
	if a.id == "" {
		a.id = cmd.AccountID.String()
	}
	ms := cmd.Now.UnixMilli()
	b := engine.MutationBlock{ID: cmd.Block.ID, Original: cmd.Block.OriginalAmount, Remaining: cmd.Block.OriginalAmount,
		Priority: cmd.Block.Priority, Source: cmd.Block.Source, StartsMS: ms, CreatedMS: ms}
	if cmd.Block.ExpiresAt != nil {
		e := cmd.Block.ExpiresAt.UnixMilli()
		b.ExpiresMS = &e
	}
	a.blocks = append(a.blocks, b)
	a.version++
	a.lifetime += b.Original
	m := f.mutation(engine.MutationGrant, cmd.OpID, cmd.Customer, cmd.IdempotencyKey, cmd.RequestHash, cmd.Now, a)
	src := cmd.Block.Source
	m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: b.Original, Type: cmd.EntryType, Source: &src, BlockID: &b.ID, Reason: cmd.Reason}}
	m.Blocks = []engine.MutationBlock{b}
	f.ledger.record(m)
	f.remember(cmd.Customer, cmd.IdempotencyKey, m)
	return engine.MutationResult{Mutation: m}, nil
}

// replay is the result remembered for customer c and key, as a replay.
func (f *fakeBlocks) replay(c engine.CustomerKey, key string) (engine.MutationResult, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	res, ok := f.ops[c.CustomerID.String()+"|"+key]
	res.Replayed = true
	return res, ok
}

// remember keeps m under customer c and key; f.mu is held.
func (f *fakeBlocks) remember(c engine.CustomerKey, key string, m engine.Mutation) {
	if f.ops == nil {
		f.ops = map[string]engine.MutationResult{}
	}
	f.ops[c.CustomerID.String()+"|"+key] = engine.MutationResult{Mutation: m}
}

func (f *fakeBlocks) Debit(_ context.Context, cmd engine.DebitCommand) (engine.MutationResult, error) {
	if res, ok := f.replay(cmd.Customer, cmd.IdempotencyKey); ok {
		return res, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.account(cmd.Customer)
	if a.id == "" {
		return engine.MutationResult{}, engine.ErrNoAccount
	}
	draws, ok := engine.PlanDebit(a.blocks, 0, cmd.Amount, cmd.Now.UnixMilli())
	if !ok {
		return engine.MutationResult{}, engine.ErrInsufficientCredits
	}
	a.version++
	var entries []engine.MutationEntry
	var changed []engine.MutationBlock
	for _, d := range draws {
		for i := range a.blocks {
			if a.blocks[i].ID == d.Block.ID {
				a.blocks[i].Remaining -= d.Amount
				changed = append(changed, a.blocks[i])
			}
		}
		id := d.Block.ID
		entries = append(entries, engine.MutationEntry{Role: engine.RoleMain, Delta: -d.Amount, Type: cmd.EntryType, Source: cmd.Source, BlockID: &id, Reason: cmd.Reason})
	}
	m := f.mutation(engine.MutationDebit, cmd.OpID, cmd.Customer, cmd.IdempotencyKey, cmd.RequestHash, cmd.Now, a)
	m.Entries, m.Blocks = entries, changed
	f.ledger.record(m)
	f.remember(cmd.Customer, cmd.IdempotencyKey, m)
	return engine.MutationResult{Mutation: m}, nil
}

func (f *fakeBlocks) Expire(context.Context, uuid.UUID, engine.CustomerKey, time.Time) (engine.MutationResult, bool, error) {
	return engine.MutationResult{}, false, nil
}

func (f *fakeBlocks) Snapshot(_ context.Context, c engine.CustomerKey, now time.Time) (engine.Account, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.account(c)
	bal := engine.ComputeBalances(a.blocks, 0, now.UnixMilli())
	acct := engine.Account{ID: a.id, Balance: bal.Balance, EffectiveBalance: bal.Effective, LifetimeEarned: a.lifetime, Version: a.version}
	for _, b := range a.blocks {
		acct.Blocks = append(acct.Blocks, b.Block(c.CustomerID))
	}
	return acct, nil
}

func (f *fakeBlocks) Partitions() int { return 1 }

func (f *fakeBlocks) Load(context.Context, engine.AccountState) (bool, error) { return true, nil }

// fakeLedger keeps every mutation's entries, newest last.
type fakeLedger struct {
	mu      sync.Mutex
	entries []engine.LedgerEntry
}

func (l *fakeLedger) record(m engine.Mutation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, m.LedgerEntries("")...)
}

func (l *fakeLedger) History(_ context.Context, q engine.HistoryQuery) (engine.Page[engine.LedgerEntry], error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []engine.LedgerEntry
	for i := len(l.entries) - 1; i >= 0; i-- {
		if e := l.entries[i]; e.CustomerID == q.CustomerID {
			out = append(out, e)
		}
	}
	if q.Cursor != "" {
		return engine.Page[engine.LedgerEntry]{}, engine.BadRequest("cursor", "cursor is invalid")
	}
	p := engine.Page[engine.LedgerEntry]{Data: out}
	if len(out) > q.Limit {
		p.Data, p.HasMore, p.NextCursor = out[:q.Limit], true, "next"
	}
	return p, nil
}

func (l *fakeLedger) Overage(context.Context, engine.CustomerKey, time.Time, time.Time) ([]engine.OverageLine, error) {
	return []engine.OverageLine{{BillableMetricKey: "api_calls", OverageMC: 1500}}, nil
}

// AccountAt answers a fixed past balance (the API's as_of tests need only
// its shape).
func (l *fakeLedger) AccountAt(context.Context, engine.CustomerKey, time.Time, int) (engine.PastAccount, error) {
	return engine.PastAccount{Balance: 700, Reserved: 100, Pending: 50}, nil
}

func (l *fakeLedger) AccountState(context.Context, engine.CustomerKey, time.Time) (engine.AccountState, bool, error) {
	return engine.AccountState{}, false, nil
}

// mustJSON decodes a response body into a generic map.
func mustJSON(b []byte) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic("bad JSON " + string(b) + ": " + err.Error())
	}
	return m
}
