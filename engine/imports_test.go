package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// failingDirectory refuses to create the customers named in fail with an
// unexpected (store) error, as Postgres does for a value it rejects.
type failingDirectory struct {
	memDirectory
	fail     map[string]bool
	onCreate func(Customer)
}

func (d *failingDirectory) CreateCustomer(ctx context.Context, c Customer) error {
	if d.fail[c.ExternalID] {
		return errors.New("persist: create customer: ERROR: invalid byte sequence (SQLSTATE 22021)")
	}
	if d.onCreate != nil {
		d.onCreate(c)
	}
	return d.memDirectory.CreateCustomer(ctx, c)
}

// importBlocks is a BlockStore that records grants, runs batches, and
// fails every grant to the customers in fail.
type importBlocks struct {
	BlockStore
	mu      sync.Mutex
	granted map[uuid.UUID]int
	batches int
	fail    map[uuid.UUID]bool
}

func (s *importBlocks) Grant(_ context.Context, cmd GrantCommand) (MutationResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail[cmd.Customer.CustomerID] {
		return MutationResult{}, errors.New("lua: grant: connection reset by peer")
	}
	s.granted[cmd.Customer.CustomerID]++
	return MutationResult{}, nil
}

func (s *importBlocks) Load(context.Context, AccountState) (bool, error) { return true, nil }

func (s *importBlocks) GrantBatch(ctx context.Context, cmds []GrantCommand) []error {
	s.mu.Lock()
	s.batches++
	s.mu.Unlock()
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		_, errs[i] = s.Grant(ctx, cmd)
	}
	return errs
}

// TestImportPerRow states the import rule of docs/spec/addendum.md §7: every row is
// judged on its own. A row whose customer the store refuses, a row whose
// grants fail and a row with a bad field are each reported by index (store
// failures as "internal error", never their Go text); the good rows around
// them are created with all their blocks, each customer's in one batch;
// the call itself succeeds.
func TestImportPerRow(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dir := &failingDirectory{fail: map[string]bool{"bad-create": true}}
	blocks := &importBlocks{granted: map[uuid.UUID]int{}, fail: map[uuid.UUID]bool{}}
	customers := NewCustomers(dir, fixedClock{now})
	imp := NewImports(customers, NewCredits(customers, blocks, nil, fixedClock{now}, nil))
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	// The block store fails the grants of the customer made for
	// "bad-grant".
	dir.onCreate = func(c Customer) {
		if c.ExternalID == "bad-grant" {
			blocks.mu.Lock()
			blocks.fail[c.ID] = true
			blocks.mu.Unlock()
		}
	}
	credit := func(n int64) ImportBlock { return ImportBlock{Credits: n} }
	cust := func(s string) CreateCustomer { return CreateCustomer{ExternalID: s} }
	in := ImportCustomers{Rows: []ImportRow{
		{Customer: cust("good-1"), Blocks: []ImportBlock{credit(10), credit(20)}},
		{Customer: cust("bad-create"), Blocks: []ImportBlock{credit(5)}},
		{Customer: cust("good-2"), Blocks: []ImportBlock{credit(1), credit(2), credit(3)}},
		{Customer: cust("bad-grant"), Blocks: []ImportBlock{credit(7), credit(8)}},
		{Customer: cust("bad-field"), Err: Invalid("credits[0].priority", "priority must be between 0 and 255")},
		{Customer: cust("good-1")},
	}}
	res, err := imp.Import(context.Background(), scope, Tenant{ID: scope.TenantID}, Idempotency{Key: "k", RequestHash: "h"}, in)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if res.Created != 2 || res.Skipped != 1 {
		t.Errorf("created %d skipped %d, want 2 and 1", res.Created, res.Skipped)
	}
	want := map[int]string{1: "internal error", 3: "internal error", 4: "credits[0].priority"}
	if len(res.Errors) != len(want) {
		t.Fatalf("errors %+v, want rows 1, 3, 4", res.Errors)
	}
	for _, e := range res.Errors {
		if w, ok := want[e.Index]; !ok || !strings.Contains(e.Error, w) || strings.Contains(e.Error, "SQLSTATE") || strings.Contains(e.Error, "lua:") {
			t.Errorf("error %+v, want row %d naming %q and nothing internal", e, e.Index, w)
		}
	}
	for _, name := range []string{"good-1", "good-2"} {
		c, err := dir.CustomerByExternalID(context.Background(), scope, name)
		if err != nil {
			t.Fatalf("%s not created: %v", name, err)
		}
		if n, wantN := blocks.granted[c.ID], map[string]int{"good-1": 2, "good-2": 3}[name]; n != wantN {
			t.Errorf("%s got %d blocks, want %d", name, n, wantN)
		}
	}
	if blocks.batches != 3 {
		t.Errorf("%d batches, want one per customer with blocks (good-1, good-2, bad-grant)", blocks.batches)
	}
}

// TestImportRowExpiry: a block that expires by now is the row's error,
// named before a shape error of a later block, as one pass over the row
// would name it; the row is never created.
func TestImportRowExpiry(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	past, future := now.Add(-time.Second), now.Add(time.Hour)
	shape := Invalid("credits[1].credits", "credits is required and must be >= 1")
	tests := []struct {
		name  string
		row   ImportRow
		field string
	}{
		{"past first", ImportRow{Blocks: []ImportBlock{{Credits: 1, ExpiresAt: &past}}, Err: shape}, "credits[0].expires_at"},
		{"now is past", ImportRow{Blocks: []ImportBlock{{Credits: 1, ExpiresAt: &now}}}, "credits[0].expires_at"},
		{"shape after a good block", ImportRow{Blocks: []ImportBlock{{Credits: 1, ExpiresAt: &future}}, Err: shape}, "credits[1].credits"},
		{"all good", ImportRow{Blocks: []ImportBlock{{Credits: 1, ExpiresAt: &future}, {Credits: 2}}}, ""},
	}
	for _, tt := range tests {
		err := tt.row.checkExpiry(now)
		e, _ := AsError(err)
		switch {
		case tt.field == "" && err != nil:
			t.Errorf("%s: got %v, want none", tt.name, err)
		case tt.field != "" && (e == nil || e.Field != tt.field):
			t.Errorf("%s: got %v, want an error naming %s", tt.name, err, tt.field)
		}
	}
}
