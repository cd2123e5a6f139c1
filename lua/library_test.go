package lua

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// TestLibraryOnRealRedis: the scripts compile as one Redis Functions
// library (every body stays within Lua's limits as a function of it), a
// Store runs them by FCALL, and a restarted node, which lost the library,
// gets it back on the next call.
func TestLibraryOnRealRedis(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStore(rdb, "lib")
	c := newCustomer()
	for round := 0; round < 2; round++ {
		if round == 1 {
			srv.Kill()
			srv.Restart()
			testenv.WaitTCP(t, srv.Addr, 5e9)
		}
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0)
		if err != nil || !ok {
			t.Fatalf("round %d: load: %v %v", round, ok, err)
		}
		if _, err := s.Grant(ctx, grantCmd(c, 1000, t0)); err != nil {
			t.Fatalf("round %d: grant: %v", round, err)
		}
		if s.noFunctions() {
			t.Fatalf("round %d: the Store fell back to EVALSHA on a Redis with functions", round)
		}
	}
	list, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "creditd_" + library().version}).Result()
	if err != nil || len(list) != 1 {
		t.Fatalf("library creditd_%s: %v %v", library().version, list, err)
	}
	have := map[string]bool{}
	for _, f := range list[0].Functions {
		have[f.Name] = true
	}
	for _, sc := range libraryScripts {
		if !have[sc.fn()] {
			t.Errorf("library lacks function %s", sc.fn())
		}
	}
}

// TestLibraryFallsBackWithoutFunctions: on a server without FUNCTION and
// FCALL (miniredis stands for Redis 6 here) the same scripts run with
// EVALSHA, single calls and pipelines alike.
func TestLibraryFallsBackWithoutFunctions(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	s := NewStore(rdb, "lib")
	c := newCustomer()
	if ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0); err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
	if !s.noFunctions() {
		t.Fatal("the Store did not notice the server has no functions")
	}
	for i, err := range s.GrantBatch(ctx, []engine.GrantCommand{grantCmd(c, 10, t0), grantCmd(c, 20, t0)}) {
		if err != nil {
			t.Fatalf("grant %d: %v", i, err)
		}
	}
}
