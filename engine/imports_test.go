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

// TestImportPerRow states the import rule of addendum 7: every row is
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
	credit := func(n int64) ImportCredit { return ImportCredit{Credits: &n} }
	ext := func(s string) *string { return &s }
	in := ImportInput{Customers: []ImportCustomer{
		{ExternalID: ext("good-1"), Credits: []ImportCredit{credit(10), credit(20)}},
		{ExternalID: ext("bad-create"), Credits: []ImportCredit{credit(5)}},
		{ExternalID: ext("good-2"), Credits: []ImportCredit{credit(1), credit(2), credit(3)}},
		{ExternalID: ext("bad-grant"), Credits: []ImportCredit{credit(7), credit(8)}},
		{ExternalID: ext("bad-field"), Credits: []ImportCredit{{Credits: ptrInt(1), Priority: ptrInt(300)}}},
		{ExternalID: ext("good-1")},
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

// TestImportCallLimits: a call past the customers or blocks per call limit
// is a 422 naming customers, and writes nothing.
func TestImportCallLimits(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	dir := &failingDirectory{}
	customers := NewCustomers(dir, fixedClock{now})
	imp := NewImports(customers, NewCredits(customers, &importBlocks{granted: map[uuid.UUID]int{}}, nil, fixedClock{now}, nil))
	many := func(rows, blocksEach int) ImportInput {
		in := ImportInput{Customers: make([]ImportCustomer, rows)}
		for i := range in.Customers {
			ext := uuid.NewString()
			in.Customers[i].ExternalID = &ext
			for j := 0; j < blocksEach; j++ {
				in.Customers[i].Credits = append(in.Customers[i].Credits, ImportCredit{Credits: ptrInt(1)})
			}
		}
		return in
	}
	for _, tc := range []struct {
		name string
		in   ImportInput
	}{
		{"too many customers", many(MaxImportCustomers+1, 0)},
		{"too many blocks in all", many(MaxImportTotalBlocks/MaxImportBlocks+1, MaxImportBlocks)},
	} {
		_, err := imp.Import(context.Background(), Scope{TenantID: uuid.New()}, Tenant{}, Idempotency{Key: "k"}, tc.in)
		if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != "customers" {
			t.Errorf("%s: err %v, want a 422 naming customers", tc.name, err)
		}
		if len(dir.customers) != 0 {
			t.Errorf("%s created %d customers", tc.name, len(dir.customers))
		}
	}
}

func ptrInt(v int64) *int64 { return &v }
