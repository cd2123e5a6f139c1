package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// TestReconcileCommand drives `creditd reconcile` on a real Postgres and
// Redis holding one account: in step it prints "reconcile: 1 customers
// checked, 0 differences" and exits 0; with Redis rolled back to an older
// version it lists the customer, prints 1 difference and exits non-zero
// (twice: a pass without --fix changes nothing); --fix reloads it and
// exits 0, and the next pass finds nothing; bad arguments are refused.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := migratedPool(t, ctx)
	src := persist.NewStore(pool)
	rdb, prefix := testenv.Redis(t)
	store := lua.NewStore(rdb, prefix)

	now := time.Now().UnixMilli()
	customer, block, tenant, account := uuid.New(), uuid.New(), uuid.New(), uuid.NewString()
	grant := func(version, remaining int64) engine.Mutation {
		return engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: tenant, CustomerID: customer,
			Environment: engine.EnvironmentLive, AtMS: now,
			Account: engine.MutationAccount{ID: account, Version: version, Balance: remaining, LifetimeEarned: 100},
			Blocks: []engine.MutationBlock{{ID: block, Original: 100, Remaining: remaining, Source: engine.SourceManual,
				StartsMS: now, CreatedMS: now}},
			Entries: []engine.MutationEntry{{Role: engine.RoleMain, Delta: 100, Type: engine.EntryAdjustment, BlockID: &block},
				{Role: engine.RoleMain, Delta: remaining - 100, Type: engine.EntryAdjustment, BlockID: &block}}}
	}
	if err := src.Apply(ctx, []engine.Mutation{grant(2, 60)}); err != nil {
		t.Fatal(err)
	}
	st, ok, err := src.AccountState(ctx, engine.CustomerKey{TenantID: tenant, CustomerID: customer}, time.Now())
	if err != nil || !ok {
		t.Fatalf("account state: %v %v", ok, err)
	}
	if _, err := store.Load(ctx, st); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out, note bytes.Buffer
		opts, err := parseReconcileArgs(append([]string{"--confirm", "0", "--drain-timeout", "0"}, args...), &note)
		if err != nil {
			return "", err
		}
		err = runReconcile(ctx, src, store, store, opts, &out, &note)
		return out.String(), err
	}
	rollBack := func() {
		old := st
		old.Version, old.Blocks = 1, []engine.MutationBlock{{ID: block, Original: 100, Remaining: 100,
			Source: engine.SourceManual, StartsMS: now, CreatedMS: now}}
		if ok, err := store.Reload(ctx, old, 2); err != nil || !ok {
			t.Fatalf("roll back: %v %v", ok, err)
		}
	}
	for _, tc := range []struct {
		name     string
		before   func()
		args     []string
		wantLine string
		wantErr  error
		wantCust bool
		// wantKinds is in the summary line when set.
		wantKinds string
		// json decodes the --json report when set; check asserts on it.
		check func(t *testing.T, rep reconcileJSON)
	}{
		{name: "in step", wantLine: "reconcile: 1 customers checked, 0 differences"},
		{name: "rolled back", before: rollBack, wantLine: "reconcile: 1 customers checked, 1 differences",
			wantErr: errDifferencesLeft, wantCust: true, wantKinds: "(version=1 blocks=1)"},
		{name: "still rolled back without --fix", wantLine: "reconcile: 1 customers checked, 1 differences",
			wantErr: errDifferencesLeft, wantCust: true},
		{name: "--fix", args: []string{"--fix"}, wantLine: "reconcile: 1 customers checked, 0 differences", wantCust: true},
		{name: "after --fix", wantLine: "reconcile: 1 customers checked, 0 differences"},
		{name: "rolled back, field by field", before: rollBack, wantErr: errDifferencesLeft, wantCust: true,
			wantLine: "reconcile: 1 customers checked, 1 differences", wantKinds: "balance: redis 100, postgres 60"},
		{name: "counts", wantErr: errDifferencesLeft, wantCust: true, wantLine: "reconcile: 1 customers checked, 1 differences",
			wantKinds: "compared: 1, equal: 0, differing: 1, missing in redis: 0, repaired: 0"},
		{name: "another tenant", args: []string{"--tenant", uuid.NewString()}, wantLine: "reconcile: 0 customers checked, 0 differences"},
		{name: "the tenant's sandbox", args: []string{"--tenant", tenant.String(), "--environment", "sandbox"},
			wantLine: "reconcile: 0 customers checked, 0 differences"},
		{name: "--json", args: []string{"--json", "--tenant", tenant.String(), "--environment", "live"}, wantErr: errDifferencesLeft,
			wantCust: true, check: func(t *testing.T, rep reconcileJSON) {
				if rep.Compared != 1 || rep.Equal != 0 || rep.Differing != 1 || rep.MissingInRedis != 0 || rep.Remaining != 1 ||
					len(rep.Differences) != 1 {
					t.Fatalf("report %+v", rep)
				}
				d := rep.Differences[0]
				want := map[string][2]string{"version": {"1", "2"}, "balance": {"100", "60"},
					"block " + block.String() + " remaining": {"100", "60"}}
				for _, f := range d.Fields {
					if w, ok := want[f.Field]; ok {
						if f.Redis != w[0] || f.Postgres != w[1] {
							t.Fatalf("field %+v, want redis %s postgres %s", f, w[0], w[1])
						}
						delete(want, f.Field)
					}
				}
				if len(want) > 0 || d.CustomerID != customer.String() || d.RedisVersion != 1 || d.PostgresVersion != 2 {
					t.Fatalf("difference %+v lacks %v", d, want)
				}
			}},
		{name: "--repair", args: []string{"--repair", "--tenant", tenant.String()}, wantCust: true,
			wantLine:  "reconcile: 1 customers checked, 0 differences",
			wantKinds: "compared: 1, equal: 0, differing: 1, missing in redis: 0, repaired: 1"},
		{name: "after --repair, --json", args: []string{"--json"}, check: func(t *testing.T, rep reconcileJSON) {
			if rep.Compared != 1 || rep.Equal != 1 || rep.Differing != 0 || len(rep.Differences) != 0 {
				t.Fatalf("report %+v", rep)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before != nil {
				tc.before()
			}
			out, err := run(tc.args...)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v; output:\n%s", err, tc.wantErr, out)
			}
			if tc.check != nil {
				var rep reconcileJSON
				if err := json.Unmarshal([]byte(out), &rep); err != nil {
					t.Fatalf("--json output is not one JSON object: %v\n%s", err, out)
				}
				tc.check(t, rep)
				if got := strings.Contains(out, customer.String()); got != tc.wantCust {
					t.Fatalf("output names the customer: %v, want %v; output:\n%s", got, tc.wantCust, out)
				}
				return
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if last := lines[len(lines)-1]; last != tc.wantLine {
				t.Fatalf("last line %q, want %q; output:\n%s", last, tc.wantLine, out)
			}
			if n := strings.Count(out, "reconcile:"); n != 1 {
				t.Fatalf("%d lines start with reconcile:, want only the last; output:\n%s", n, out)
			}
			if tc.wantKinds != "" && !strings.Contains(out, tc.wantKinds) {
				t.Fatalf("summary lacks %q; output:\n%s", tc.wantKinds, out)
			}
			if got := strings.Contains(out, customer.String()); got != tc.wantCust {
				t.Fatalf("output names the customer: %v, want %v; output:\n%s", got, tc.wantCust, out)
			}
		})
	}
	for _, bad := range [][]string{{"--limit", "0"}, {"--page", "100000"}, {"extra"}, {"--no-such-flag"},
		{"--tenant", "acme"}, {"--tenant", uuid.Nil.String()}, {"--environment", "staging"}} {
		if _, err := run(bad...); err == nil || errors.Is(err, errDifferencesLeft) {
			t.Errorf("args %v: %v, want a usage error", bad, err)
		}
	}
}

// fakeBacklog drains one entry per Backlog round over all partitions.
type fakeBacklog struct{ left int64 }

func (f *fakeBacklog) Partitions() int { return 2 }

func (f *fakeBacklog) Backlog(_ context.Context, p int) (int64, int64, error) {
	n := f.left
	if p == 1 && f.left > 0 {
		f.left-- // one committed per round
	}
	return n, 0, nil
}

// TestWaitDrained: the drain wait returns 0 as soon as every partition is
// empty, and the entries left when its timeout passes first.
func TestWaitDrained(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		backlog  int64
		timeout  time.Duration
		wantLeft bool
	}{
		{"empty", 0, time.Second, false},
		{"drains", 2, 5 * time.Second, false},
		{"times out", 1000, 150 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, err := waitDrained(context.Background(), &fakeBacklog{left: tc.backlog}, tc.timeout)
			if err != nil || (left > 0) != tc.wantLeft {
				t.Fatalf("left %d, %v; want entries left: %v", left, err, tc.wantLeft)
			}
		})
	}
}
