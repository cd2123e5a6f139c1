package persist

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// replayView is what a replayed answer reads from a Mutation: the consume
// answer (engine's consumeResult: customer, usage, the main entry's id,
// the account's balance, reserved and pending), its duplicate_replay age
// (the instant) and the retry's fingerprint check (the request hash).
type replayView struct {
	Op, Tenant, Customer       uuid.UUID
	Env, Key, RequestHash      string
	AtMS                       int64
	Usage                      engine.MutationUsage
	Transaction                uuid.UUID
	Balance, Reserved, Pending int64
}

func viewOf(m engine.Mutation) replayView {
	v := replayView{Op: m.OpID, Tenant: m.TenantID, Customer: m.CustomerID, Env: string(m.Environment),
		Key: m.IdempotencyKey, RequestHash: m.RequestHash, AtMS: m.AtMS,
		Balance: m.Account.Balance, Reserved: m.Account.Reserved, Pending: m.Account.Pending}
	if m.Usage != nil {
		v.Usage = *m.Usage
	}
	for i, e := range m.Entries {
		if e.Role == engine.RoleMain {
			v.Transaction = engine.EntryID(m.OpID, i)
			break
		}
	}
	return v
}

// TestLeanConsumeReplays (invariant 4): a retried key finds its operation
// whichever shape recorded it, and answers the figures of the first run:
// a lean consume (its ledger entry, expiry entries before it, an overage,
// a request hash holding the separator), a consume and a grant recorded
// whole (the release before migration 023, or a Store WithFullRecords),
// through AppliedOps and the usage look-up alike; another customer's or
// tenant's key finds nothing.
func TestLeanConsumeReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	other, _ := b.tenant(t)
	full := NewStore(b.pool).WithFullRecords(true)

	c := &leanCustomer{id: uuid.New(), block: uuid.New(), ext: "u-1", balance: 1_000_000}
	if err := b.store.Apply(b.ctx, []engine.Mutation{c.grant(live.TenantID)}); err != nil {
		t.Fatal(err)
	}
	plain := c.consume(live.TenantID)
	over := c.consume(live.TenantID)
	o := int64(40)
	over.Usage.Overage, over.Usage.Cost, over.Account.Reserved, over.Account.Pending = o, 340, 7, 9
	over.Entries[0].Overage = &o
	over.RequestHash = "usage-a|b"
	expired := c.consume(live.TenantID)
	blk := uuid.New()
	expired.Entries = append([]engine.MutationEntry{
		{Role: engine.RoleExpiry, Delta: -5, Type: engine.EntryExpiry, BlockID: &blk},
		{Role: engine.RoleExpiry, Delta: -6, Type: engine.EntryExpiry, BlockID: &blk}}, expired.Entries...)
	old := c.consume(live.TenantID)
	v := c.version
	grant := c.grant(live.TenantID) // a keyed operation other than a consume
	c.version = v + 1
	grant.Account.Version = c.version
	lean := []engine.Mutation{plain, over, expired}
	for _, m := range lean {
		if _, _, ok := leanHead(&m); !ok {
			t.Fatalf("consume %s does not take the lean shape", m.IdempotencyKey)
		}
	}
	if err := b.store.Apply(b.ctx, lean); err != nil {
		t.Fatal(err)
	}
	if err := full.Apply(b.ctx, []engine.Mutation{old, grant}); err != nil {
		t.Fatal(err)
	}
	var ops, heads int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM operations WHERE customer_id = $1),
		(SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND op_head IS NOT NULL)`, c.id).Scan(&ops, &heads); err != nil {
		t.Fatal(err)
	}
	if ops != 3 || heads != 3 {
		t.Errorf("%d operations rows and %d op heads, want 3 (two grants, the full consume) and 3", ops, heads)
	}

	batcher := NewAppliedBatcher(b.store)
	key := engine.CustomerKey{TenantID: live.TenantID, Environment: engine.EnvironmentLive, CustomerID: c.id}
	all := append(append([]engine.Mutation{}, lean...), old, grant)
	refs := make([]engine.OpRef, len(all))
	keys := make([]string, len(all))
	for i, m := range all {
		refs[i], keys[i] = engine.OpRef{Customer: key, Key: m.IdempotencyKey}, m.IdempotencyKey
	}
	got, found, err := batcher.AppliedOps(b.ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	byKey, err := b.store.AppliedMutations(b.ctx, live.TenantID, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range all {
		if !found[i] {
			t.Errorf("%s: not found", m.IdempotencyKey)
			continue
		}
		want := viewOf(m)
		if g := viewOf(got[i]); !reflect.DeepEqual(g, want) {
			t.Errorf("%s: AppliedOps answers\n%+v\nwant\n%+v", m.IdempotencyKey, g, want)
		}
		if g := viewOf(byKey[m.IdempotencyKey]); !reflect.DeepEqual(g, want) {
			t.Errorf("%s: AppliedMutations answers\n%+v\nwant\n%+v", m.IdempotencyKey, g, want)
		}
	}

	otherCustomer := key
	otherCustomer.CustomerID = uuid.New()
	otherTenant := key
	otherTenant.TenantID = other.TenantID
	_, found, err = batcher.AppliedOps(b.ctx, []engine.OpRef{{Customer: otherCustomer, Key: plain.IdempotencyKey},
		{Customer: otherTenant, Key: plain.IdempotencyKey}, {Customer: key, Key: "never"}})
	if err != nil {
		t.Fatal(err)
	}
	if found[0] || found[1] || found[2] {
		t.Errorf("found %v for another customer, another tenant and an unknown key, want none", found)
	}
	if m, err := b.store.AppliedMutations(b.ctx, other.TenantID, []string{plain.IdempotencyKey}); err != nil || len(m) != 0 {
		t.Errorf("another tenant's usage look-up: %v, %v; want nothing", m, err)
	}
}

// TestLeanHeadRefuses: only a consume whose entry and head give back its
// answer's figures takes the lean shape; the others keep an operations row.
func TestLeanHeadRefuses(t *testing.T) {
	t.Parallel()
	c := &leanCustomer{id: uuid.New(), block: uuid.New(), balance: 1_000_000}
	tenant := uuid.New()
	for _, tc := range []struct {
		name   string
		change func(m *engine.Mutation)
	}{
		{"no key", func(m *engine.Mutation) { m.IdempotencyKey = "" }},
		{"a grant", func(m *engine.Mutation) { m.Kind = engine.MutationGrant }},
		{"a commit", func(m *engine.Mutation) { m.Kind = engine.MutationCommit }},
		{"refused", func(m *engine.Mutation) { m.Usage.Refused = true; m.Entries = nil }},
		{"items", func(m *engine.Mutation) {
			m.Usage.Items = []engine.UsageItem{{Metric: "a", Units: 1, Cost: 1}}
		}},
		{"a reservation's usage", func(m *engine.Mutation) { id := uuid.New(); m.Usage.ReservationID = &id }},
		{"charge off the entry", func(m *engine.Mutation) { m.Usage.Charged = 299 }},
		{"units off the entry", func(m *engine.Mutation) { m.Usage.Units = 4 }},
		{"metric off the entry", func(m *engine.Mutation) { m.Usage.Metric = "other" }},
		{"overage off the entry", func(m *engine.Mutation) { m.Usage.Overage = 1 }},
		{"main entry not last", func(m *engine.Mutation) {
			m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleExpiry, Type: engine.EntryExpiry})
		}},
	} {
		m := c.consume(tenant)
		if _, _, ok := leanHead(&m); !ok {
			t.Fatalf("%s: the plain consume does not take the lean shape", tc.name)
		}
		tc.change(&m)
		if head, _, ok := leanHead(&m); ok {
			t.Errorf("%s: takes the lean shape (%q)", tc.name, head)
		}
	}
}

// TestLeanEventBody: an event body stored lean reads back byte for byte
// as Go built it, sequence first; a body stored whole (the release before
// migration 023, a filled row, a body whose opening the columns do not
// rebuild) reads back as stored.
func TestLeanEventBody(t *testing.T) {
	t.Parallel()
	c := &leanCustomer{id: uuid.New(), block: uuid.New(), ext: "u\"<1>", balance: 1_000_000}
	m := c.consume(uuid.New())
	evs := engine.EventsOf(m)
	if len(evs) == 0 {
		t.Fatal("a consume owes no event")
	}
	for _, e := range evs {
		body := string(e.Payload)
		lean := leanEventBody(body, e.ID, e.EventType, e.TenantID, e.Environment, e.CustomerID)
		if len(lean) > len(body)-200 {
			t.Errorf("%s: lean body %d bytes of %d", e.EventType, len(lean), len(body))
		}
		want := sequencedPayload(42, body)
		if got := string(wholeEventBody(sequencedPayload(42, lean), e.ID, e.EventType, e.TenantID, e.Environment, e.CustomerID)); got != want {
			t.Errorf("%s: lean body reads back\n%s\nwant\n%s", e.EventType, got, want)
		}
		if got := string(wholeEventBody(want, e.ID, e.EventType, e.TenantID, e.Environment, e.CustomerID)); got != want {
			t.Errorf("%s: whole body reads back\n%s\nwant\n%s", e.EventType, got, want)
		}
		other := uuid.New()
		if got := leanEventBody(body, other, e.EventType, e.TenantID, e.Environment, e.CustomerID); got != body {
			t.Errorf("%s: a body whose opening the columns do not rebuild is stored %q", e.EventType, got)
		}
	}
}

// TestAppliedKeysSinceReadsLeanConsumes (invariant 4): the seen filter's
// seeding lists the key of a lean consume (its ledger entry's op head) as
// it lists an operations row's, so a node that starts after the consume
// still asks Postgres about its retry.
func TestAppliedKeysSinceReadsLeanConsumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	c := &leanCustomer{id: uuid.New(), block: uuid.New(), ext: "u-1", balance: 1_000_000}
	grant := c.grant(live.TenantID)
	consume := c.consume(live.TenantID)
	if err := b.store.Apply(b.ctx, []engine.Mutation{grant, consume}); err != nil {
		t.Fatal(err)
	}
	got := map[string]engine.CustomerKey{}
	err := b.store.AppliedKeysSince(b.ctx, grant.At().Add(-time.Minute), 1, func(refs []engine.OpRef) error {
		for _, r := range refs {
			got[r.Key] = r.Customer
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []engine.Mutation{grant, consume} {
		if k, ok := got[m.IdempotencyKey]; !ok || k.CustomerID != c.id || k.TenantID != live.TenantID {
			t.Errorf("key %s: %+v, %v; want customer %s of tenant %s", m.IdempotencyKey, k, ok, c.id, live.TenantID)
		}
	}
}

// TestSeedingReadsRecentOnly (issue 26): the seen filter's seeding, which
// every node start runs for the last hour or so, reads the ledger and the
// operations through their created_at BRIN indexes (migration 025), not
// from end to end: of 60,000 older ledger entries and operations it reads
// the last block range's.
func TestSeedingReadsRecentOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	// Entries appended in created_at order, as the persister appends them,
	// the newest a day old.
	conn := b.planSession(t,
		leanLedgerRows(live.TenantID, "seed-", "now() - interval '30 days' + g * interval '30 seconds'"),
		`INSERT INTO operations (op_id, tenant_id, customer_id, idempotency_key, account_version, mutation, created_at)
			SELECT gen_random_uuid(), '`+live.TenantID.String()+`', gen_random_uuid(), 'seed-op-' || g, 1, '{}',
				now() - interval '30 days' + g * interval '30 seconds'
			FROM generate_series(1, 60000) AS g`,
		`ANALYZE ledger_entries`,
		`ANALYZE operations`)
	var raw string
	since := time.Now().Add(-time.Hour)
	if err := conn.QueryRow(b.ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+appliedKeysSinceSQL, since).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	// The ledger is partitioned by month (migration 033): its BRIN is each
	// partition's, and the empty months are scanned (reading nothing).
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &plans); err != nil || len(plans) != 1 {
		t.Fatalf("plan %s: %v", raw, err)
	}
	parts := readPartitions(t, b.ctx, conn)
	// On a month's first day the bound on created_at may prune every
	// partition that holds rows (the newest seeded row is a day old): the
	// plan then scans only empty months, which reads nothing, and has no
	// BRIN index to use.
	var seq, scansRows, ledgerBRIN, opsBRIN bool
	plans[0].Plan.walk(func(n planNode) {
		if n.NodeType == "Seq Scan" && !parts.emptyScan(n) {
			seq = true
		}
		if n.IndexName != "" {
			scansRows = true
		}
		ledgerBRIN = ledgerBRIN || parts.index(n.IndexName) == "ledger_entries_created_brin"
		opsBRIN = opsBRIN || parts.index(n.IndexName) == "operations_created_brin"
	})
	scansRows = scansRows || seq
	if seq || (scansRows && (!ledgerBRIN || !opsBRIN)) {
		t.Errorf("the seeding's read of the last hour:\n%s\nwant the created_at BRIN indexes, no scan of a whole table", raw)
	}
}
