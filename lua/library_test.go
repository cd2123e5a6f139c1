package lua

import (
	"context"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// privateRedis is a client of a redis-server of the test's own
// (testenv.StartRedisServer), for what is server-wide: command counts, the
// Lua state, the function library.
func privateRedis(t testing.TB) *redis.Client {
	t.Helper()
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// commandStats is rdb's INFO commandstats: per command, lower case as
// Redis names it ("fcall", "hgetall"), its calls and microseconds.
func commandStats(t testing.TB, rdb *redis.Client) map[string][2]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st [2]int64
		for _, kv := range strings.Split(rest, ",") {
			switch k, v, _ := strings.Cut(kv, "="); k {
			case "calls":
				st[0], _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st[1], _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out
}

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

// TestScriptMutationsTakeTheFastPath: every kind of Mutation the scripts
// write to the outbox (grants with metadata and expiry, consumes with
// context and entry metadata, a drain over several blocks, reservations with
// metadata, commit, release, gauge, negative adjust, expiry) is read by
// engine.DecodeMutation's own decoder, not handed to encoding/json.
func TestScriptMutationsTakeTheFastPath(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	s := NewStore(rdb, prefix)
	c := newCustomer()
	if ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0); err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
	meta := engine.Metadata{"k": json.RawMessage(`"v é \" \n"`), "n": json.RawMessage(`[1,2.5,{"x":null}]`)}
	for i := 0; i < 3; i++ {
		g := grantCmd(c, 100, t0)
		g.Block.Metadata = meta
		exp := t0.Add(time.Duration(i+1) * time.Hour)
		g.Block.ExpiresAt = &exp
		if _, err := s.Grant(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 3}
	cc := consumeCmd(c, 50, terms, engine.OveragePolicyBlock, t0)
	cc.EntryMetadata = meta
	cc.Context = engine.MutationContext{ExternalID: "ext-1", ThresholdMC: 10}
	must := func(_ engine.MutationResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.Consume(ctx, cc))
	mc := multiCmd(c, engine.OveragePolicyBlock, line("api.calls", 2, terms), line("gpu.seconds", 1, terms))
	mc.EntryMetadata = meta
	must(s.Consume(ctx, mc))
	rc := reserveCmd(c, 2, terms, time.Hour, t0)
	rc.Metadata = meta
	reservation, err := s.Reserve(ctx, rc)
	must(reservation, err)
	must(s.Commit(ctx, commitCmd(c, reservation.Mutation.Reservation.ID, 1, terms, t0)))
	reservation2, err := s.Reserve(ctx, reserveCmd(c, 1, terms, time.Hour, t0))
	must(reservation2, err)
	must(s.Release(ctx, releaseCmd(c, reservation2.Mutation.Reservation.ID, false, t0)))
	must(s.Gauge(ctx, engine.GaugeCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0}, Metric: "seats", Delta: 1, Cap: 10}))
	must(s.Debit(ctx, debitCmd(c, 20, t0)))
	if _, _, err := s.Expire(ctx, uuid.New(), c, t0.Add(90*time.Minute)); err != nil {
		t.Fatal(err)
	}
	msgs, err := rdb.XRange(ctx, s.outboxKey(Partition(c.CustomerID)), "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, m := range msgs {
		doc, _ := m.Values[outboxField].(string)
		var mu engine.Mutation
		if err := engine.DecodeMutation([]byte(doc), &mu); err != nil || mu.CustomerID != c.CustomerID {
			continue // another test's customer on this partition
		}
		kinds[string(mu.Kind)] = true
		if !engine.MutationFastPath([]byte(doc)) {
			t.Errorf("%s mutation took the slow path: %.300s", mu.Kind, doc)
		}
	}
	if len(kinds) < 7 {
		t.Fatalf("only %d kinds of mutation seen: %v", len(kinds), kinds)
	}
}

// TestLibraryLoadPrunesOldBuilds: a fresh load keeps this build's library
// and the libraryKeep-1 most recently loaded others and deletes older
// ones (an unrecorded build counts as the oldest); a deleted build that
// still runs loads its library again on its next call.
func TestLibraryLoadPrunesOldBuilds(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	// Five older builds: a one-function library each, three recorded with
	// their load times (b2 the newest) and two never recorded.
	olds := []string{"0000000000b0", "0000000000b1", "0000000000b2", "0000000000u0", "0000000000u1"}
	for _, v := range olds {
		src := "#!lua name=" + libraryPrefix + v + "\nredis.register_function('creditd_ping_" + v + "', function() return 'pong' end)"
		if err := rdb.FunctionLoad(ctx, src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb.HSet(ctx, libraryRegistry, "0000000000b0", 1000, "0000000000b1", 2000, "0000000000b2", 3000)

	s := NewStore(rdb, "prune")
	c := newCustomer()
	if ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0); err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
	if _, err := s.Grant(ctx, grantCmd(c, 1000, t0)); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryPrefix + "*"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range libs {
			out = append(out, strings.TrimPrefix(l.Name, libraryPrefix))
		}
		sort.Strings(out)
		return out
	}
	want := []string{"0000000000b1", "0000000000b2", library().version}
	sort.Strings(want)
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("libraries after a fresh load: %v, want %v", got, want)
	}
	if n, _ := rdb.HExists(ctx, libraryRegistry, "0000000000b0").Result(); n {
		t.Errorf("the registry still names the deleted build b0")
	}
	if at, _ := rdb.HGet(ctx, libraryRegistry, library().version).Int64(); at == 0 {
		t.Errorf("the registry lacks this build's load time")
	}
	// This build's library deleted under it (a newer build pruned it): the
	// next call loads it again.
	if err := rdb.FunctionDelete(ctx, libraryPrefix+library().version).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Grant(ctx, grantCmd(c, 1000, t0)); err != nil {
		t.Fatalf("grant after this build's library was deleted: %v", err)
	}
	if got := names(); !slices.Contains(got, library().version) {
		t.Fatalf("libraries after the reload: %v, want this build's", got)
	}
}

// TestLibraryPacesCollector: the library's first call sets the Lua
// collector's step multiplier of the node's Functions state to GC_STEPMUL
// (library_gc.lua), the state's default (200) before it; and a library
// loaded again after FUNCTION FLUSH sets it again on its first call.
func TestLibraryPacesCollector(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	// The probe sets the multiplier and answers the one before it.
	const probe = "#!lua name=gcprobe\nredis.register_function('gcprobe', " +
		"function(keys, args) return collectgarbage('setstepmul', tonumber(args[1])) end)"
	swap := func(to int) int64 {
		t.Helper()
		if err := rdb.Do(ctx, "FUNCTION", "LOAD", "REPLACE", probe).Err(); err != nil {
			t.Fatalf("load the probe: %v", err)
		}
		n, err := rdb.Do(ctx, "FCALL", "gcprobe", 0, to).Int64()
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		return n
	}
	s := NewStore(rdb, "gc")
	for round := range 2 {
		c := newCustomer()
		if round == 1 {
			if err := rdb.FunctionFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if got := swap(200); round == 0 && got != 200 {
			t.Fatalf("a fresh node's step multiplier is %d, want Lua's default 200", got)
		}
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0)
		if err != nil || !ok {
			t.Fatalf("round %d: load: %v %v", round, ok, err)
		}
		if got := swap(200); got != 50 {
			t.Errorf("round %d: after the library's first call the step multiplier is %d, want 50", round, got)
		}
	}
}
