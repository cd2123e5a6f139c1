package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// TestAppliedBatcher: a money call's look-up finds the persisted operation
// of that customer under that key and nothing else (another customer,
// another tenant, an unknown key), and many concurrent callers get their
// own answers while sharing queries.
func TestAppliedBatcher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	other, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	acct, acct2 := newAccount(live, now), newAccount(live, now)
	var ms []engine.Mutation
	for i := range 40 {
		ms = append(ms, acct.grant(fmt.Sprintf("k%d", i), 1, nil))
	}
	ms = append(ms, acct2.grant("shared", 1, nil))
	if err := b.store.Apply(b.ctx, ms); err != nil {
		t.Fatal(err)
	}
	batcher := NewAppliedBatcher(b.store)
	own := acct.key
	otherCustomer := acct2.key
	otherTenant := engine.CustomerKey{TenantID: other.TenantID, Environment: own.Environment, CustomerID: own.CustomerID}
	for _, tc := range []struct {
		name  string
		ref   engine.OpRef
		found bool
		op    uuid.UUID
	}{
		{"own key", engine.OpRef{Customer: own, Key: "k3"}, true, ms[3].OpID},
		{"unknown key", engine.OpRef{Customer: own, Key: "nope"}, false, uuid.Nil},
		{"another customer's key", engine.OpRef{Customer: own, Key: "shared"}, false, uuid.Nil},
		{"the other customer", engine.OpRef{Customer: otherCustomer, Key: "shared"}, true, ms[40].OpID},
		{"another tenant", engine.OpRef{Customer: otherTenant, Key: "k3"}, false, uuid.Nil},
	} {
		got, found, err := batcher.AppliedOps(b.ctx, []engine.OpRef{tc.ref})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if found[0] != tc.found || got[0].OpID != tc.op {
			t.Errorf("%s: found %v op %s, want %v %s", tc.name, found[0], got[0].OpID, tc.found, tc.op)
		}
	}

	// 200 concurrent callers, each with its own key (every other one persisted).
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("k%d", i%80)
			got, found, err := batcher.AppliedOps(b.ctx, []engine.OpRef{{Customer: own, Key: key}, {Customer: own, Key: "nope"}})
			switch want := i%80 < 40; {
			case err != nil:
				errs <- err
			case found[0] != want || found[1]:
				errs <- fmt.Errorf("%s: found %v, want %v", key, found, want)
			case want && (got[0].OpID != ms[i%80].OpID || got[0].IdempotencyKey != key):
				errs <- fmt.Errorf("%s: op %s", key, got[0].OpID)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	if _, _, err := batcher.AppliedOps(ctx, []engine.OpRef{{Customer: own, Key: "k1"}}); err == nil {
		// The answer may win the race with the ended context; both are fine
		// as long as nothing hangs.
		t.Log("answered before the ended context was seen")
	}
}

// forgettingOutbox is a fakeOutbox whose ForgetOps records, for every
// Mutation it is asked to forget, whether Postgres already held it.
type forgettingOutbox struct {
	*fakeOutbox
	b      *bundle
	mu     sync.Mutex
	forgot map[string]bool // idempotency key -> committed at the time
}

func (o *forgettingOutbox) ForgetOps(ctx context.Context, _ int, ms []engine.Mutation) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range ms {
		var n int
		if err := o.b.pool.QueryRow(ctx, `SELECT count(*) FROM operations WHERE op_id = $1`, m.OpID).Scan(&n); err != nil {
			return err
		}
		o.forgot[m.IdempotencyKey] = n == 1
	}
	return nil
}

// TestPersisterForgetsOpKeysAfterCommit: the persister shortens op keys
// only for mutations it has committed (so an op key Redis lacks always has
// its operation in Postgres, invariant 4), through failed commits and
// retries, and never for a dead-lettered mutation.
func TestPersisterForgetsOpKeysAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	ob := &forgettingOutbox{fakeOutbox: newFakeOutbox(2), b: b, forgot: map[string]bool{}}
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	other := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	for i := range 20 {
		ob.add(0, a.grant(fmt.Sprintf("a%d", i), 1, nil))
	}
	poison := other.grant("poison", 1, nil)
	poison.Entries[0].Metadata = json.RawMessage(`{"x":"\u0000"}`)
	ob.add(1, other.grant("o1", 1, nil), poison, other.grant("o2", 1, nil))

	w := &flakyWriter{inner: b.store, commitOn: 1}
	per := NewPersister(ob, w, PersisterConfig{Consumer: "c", BatchSize: 6, Block: 5 * time.Millisecond}, quietLog())
	per.dead = b.store // the flaky writer hides the store's dead letters
	per.mayHold.Store(true)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	ob.mu.Lock()
	defer ob.mu.Unlock()
	for i := range 20 {
		k := fmt.Sprintf("a%d", i)
		if committed, asked := ob.forgot[k]; !asked || !committed {
			t.Errorf("%s: forgotten %v, committed then %v; want forgotten after its commit", k, asked, committed)
		}
	}
	if committed, asked := ob.forgot["o1"]; !asked || !committed {
		t.Errorf("o1: forgotten %v, committed then %v", asked, committed)
	}
	for _, k := range []string{"poison", "o2"} {
		if _, asked := ob.forgot[k]; asked {
			t.Errorf("%s (dead-lettered) was forgotten", k)
		}
	}
}

// TestAppliedAfterRestart: when Postgres ends every connection of the pool
// (as a restart does), the next look-up still answers, on a new
// connection, instead of failing on the dead one it was handed.
func TestAppliedAfterRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	acct := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	m := acct.grant("k", 1, nil)
	if err := b.store.Apply(b.ctx, []engine.Mutation{m}); err != nil {
		t.Fatal(err)
	}
	batcher := NewAppliedBatcher(b.store)
	ref := []engine.OpRef{{Customer: acct.key, Key: "k"}}
	for round := range 3 {
		// The pool's connection was used just now, so the pool hands it
		// out again without a ping.
		if _, _, err := batcher.AppliedOps(b.ctx, ref); err != nil {
			t.Fatalf("round %d, before: %v", round, err)
		}
		killer, err := pgx.Connect(b.ctx, b.pool.Config().ConnConfig.ConnString())
		if err != nil {
			t.Fatal(err)
		}
		var ended int
		err = killer.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&ended)
		killer.Close(b.ctx)
		if err != nil || ended == 0 {
			t.Fatalf("round %d: ended %d backends: %v", round, ended, err)
		}
		got, found, err := batcher.AppliedOps(b.ctx, ref)
		if err != nil {
			t.Fatalf("round %d: the look-up after the backends ended: %v", round, err)
		}
		if !found[0] || got[0].OpID != m.OpID {
			t.Fatalf("round %d: found %v op %s, want %s", round, found[0], got[0].OpID, m.OpID)
		}
	}
}
