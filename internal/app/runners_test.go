package app

import (
	"context"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// offlineApp is an App wired on clients that never connect: New does no
// I/O, so its wiring can be read without Redis or Postgres.
func offlineApp(t *testing.T) *App {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	a := New(rdb, pool, Config{}, zerolog.Nop())
	t.Cleanup(func() {
		a.Stop(0)
		pool.Close()
		_ = rdb.Close()
	})
	return a
}

// TestRunnersListEveryLoop: every App field that is a Runner is in the
// runner list Start and Stop walk (a new loop cannot be left out), once,
// and each has its own /readyz entry, advisory, whose name no other check
// uses; redis gates readiness, postgres, persister lag and dead letters
// only warn (issue 25).
func TestRunnersListEveryLoop(t *testing.T) {
	a := offlineApp(t)
	listed := map[engine.Runner]int{}
	for _, r := range a.runners {
		listed[r]++
	}
	runnerType := reflect.TypeFor[engine.Runner]()
	v := reflect.ValueOf(a).Elem()
	fields := 0
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if !f.IsExported() || !f.Type.Implements(runnerType) {
			continue
		}
		fields++
		r, _ := v.Field(i).Interface().(engine.Runner)
		if n := listed[r]; n != 1 {
			t.Errorf("App.%s is a Runner listed %d times in App.runners, want once", f.Name, n)
		}
	}
	if fields != len(a.runners) {
		t.Errorf("App has %d Runner fields, App.runners lists %d", fields, len(a.runners))
	}
	checks := map[string][]bool{}
	for _, c := range a.readyChecks {
		checks[c.Name] = append(checks[c.Name], c.Advisory)
	}
	for _, r := range a.runners {
		if got := checks[r.Name()]; len(got) != 1 || !got[0] {
			t.Errorf("runner %q: /readyz entries %v, want one advisory entry", r.Name(), got)
		}
	}
	// Only what this node needs to serve gates readiness; what every node
	// sees alike warns (docs/decisions.md "Readiness is this node's").
	for _, c := range []struct {
		name     string
		advisory bool
	}{{"redis", false}, {"postgres", true}, {"persister", true}, {"dead_letters", true}, {"partitions", true}} {
		if got := checks[c.name]; len(got) != 1 || got[0] != c.advisory {
			t.Errorf("check %q: entries %v, want one with advisory %v", c.name, got, c.advisory)
		}
	}
}

// TestRunnersHealthFollowsLifecycle: before Start each runner's /readyz
// entry says it is not started, and after Stop (here without a Start)
// each says stopped.
func TestRunnersHealthFollowsLifecycle(t *testing.T) {
	a := offlineApp(t)
	checks := runnerChecks(a.runners)
	for _, c := range checks {
		if err := c.Check(context.Background()); err == nil || err.Error() != "not started" {
			t.Errorf("%s before Start: %v, want not started", c.Name, err)
		}
	}
	a.Stop(0)
	for _, c := range checks {
		if err := c.Check(context.Background()); err == nil || err.Error() != "stopped" {
			t.Errorf("%s after Stop: %v, want stopped", c.Name, err)
		}
	}
}
