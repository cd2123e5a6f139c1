package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisKeys lists the stack's keys matching pattern (after "{prefix").
func redisKeys(t *testing.T, s *Stack, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	var out []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, "{"+s.Prefix+pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	if cc, ok := s.Redis.(*redis.ClusterClient); ok {
		// A Cluster's SCAN covers one node: every master's keys.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.Redis)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// dropKeys deletes keys one by one (they may live in several Cluster slots).
func dropKeys(t *testing.T, s *Stack, keys []string) {
	t.Helper()
	for _, k := range keys {
		if err := s.Redis.Del(context.Background(), k).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// withoutReason is a consume body with its reason member removed.
func withoutReason(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	delete(m, "reason")
	return m
}

// TestReplayFromPostgres (issue 10): once the persister has committed a
// money operation, Redis keeps its op key only for the grace
// (idempotency.OpKeyGrace), and Postgres answers every retry from then on,
// forever (invariant 4). Per money route:
//   - op key gone, HTTP record there: the retry answers the first status,
//     headers and body byte for byte, X-Idempotent-Replayed, no new effect;
//   - HTTP record gone too (lapsed or lost within 24 h): a fresh claim
//     answers the first status and body, no new effect; racing twins of it
//     all answer the same;
//   - past 24 h: a consume answers its original numbers with reason
//     duplicate_replay and charges nothing; a grant grants nothing.
//
// The consume's record in Postgres is its ledger entry (op_head), the
// other operations' an operations row: both shapes answer.
func TestReplayFromPostgres(t *testing.T) {
	clock := newTestClock(time.Now())
	s := NewStack(t, WithClock(clock))
	tn := s.NewTenant(uniq("pgreplay"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000_000})
	reservationA := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30, "ttl_seconds": 86400})
	reservationB := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 20, "ttl_seconds": 86400})

	type call struct {
		name, path string
		body       map[string]any
		status     int
	}
	calls := []call{
		{"grant", "/v1/customers/" + id + "/credits/grant", map[string]any{"credits": 5000, "source": "promotional", "reason": "r",
			"metadata": map[string]any{"k": "v"}}, 201},
		{"adjust up", "/v1/customers/" + id + "/credits/adjust", map[string]any{"delta": 300, "source": "manual", "reason": "r"}, 200},
		{"adjust down by external id", "/v1/customer-by-external-id/" + ext + "/credits/adjust", map[string]any{"delta": -4321, "source": "manual", "reason": "r"}, 200},
		{"consume", "/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 3}, 200},
		{"reserve", "/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 5, "ttl_seconds": 86400}, 201},
		{"commit", "/v1/reservations/" + reservationA["id"].(string) + "/commit", map[string]any{"actual_units": 12}, 200},
		{"release", "/v1/reservations/" + reservationB["id"].(string) + "/release", map[string]any{}, 200},
	}
	const consumeCall = 3
	keys := make([]string, len(calls))
	firsts := make([]Response, len(calls))
	for i, c := range calls {
		keys[i] = idemKey()
		firsts[i] = a.do("POST", c.path, keys[i], c.body)
		wantStatus(t, firsts[i], c.status, c.name)
	}
	s.Drain()
	// The consume's record is its ledger entry's op head, not an
	// operations row (docs/decisions.md, "Lean records"), so the replays
	// below answer from it.
	var opRows, heads int
	if err := s.Pool.QueryRow(context.Background(), `SELECT
		(SELECT count(*) FROM operations WHERE idempotency_key = $1),
		(SELECT count(*) FROM ledger_entries WHERE idempotency_key = $1 AND op_head IS NOT NULL)`,
		keys[consumeCall]).Scan(&opRows, &heads); err != nil {
		t.Fatal(err)
	}
	if opRows != 0 || heads != 1 {
		t.Errorf("consume recorded in %d operations rows and %d op heads, want 0 and 1", opRows, heads)
	}
	// The persister committed every operation and shortened its op key to
	// the grace; none keeps the 24 h safety net.
	ops := redisKeys(t, s, ":p*}:op:*")
	if len(ops) == 0 {
		t.Fatalf("no op keys before the grace ran out")
	}
	for _, k := range ops {
		if ttl := s.Redis.PTTL(context.Background(), k).Val(); ttl > time.Minute || ttl <= 0 {
			t.Errorf("op key %s: TTL %s after its commit, want at most a minute", k, ttl)
		}
	}
	dropKeys(t, s, ops) // the grace ran out
	balance := a.balance(id)
	history := len(a.history(id, "?limit=100"))
	unchanged := func(when string) {
		t.Helper()
		s.Drain()
		if b := a.balance(id); b != balance {
			t.Errorf("%s: balance %d, want %d (no second effect)", when, b, balance)
		}
		if h := len(a.history(id, "?limit=100")); h != history {
			t.Errorf("%s: %d history entries, want %d", when, h, history)
		}
		if n := len(redisKeys(t, s, ":p*}:op:*")); n != 0 {
			t.Errorf("%s: %d op keys written by replays", when, n)
		}
	}

	for i, c := range calls {
		again := a.do("POST", c.path, keys[i], c.body)
		first := firsts[i]
		if again.Status != first.Status || !bytes.Equal(again.Raw, first.Raw) || headersOf(again.Header) != headersOf(first.Header) ||
			again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("%s, op key gone: %d %s\n%s\nwant %d %s", c.name, again.Status, headersOf(again.Header), again.Raw, first.Status, first.Raw)
		}
	}
	unchanged("op keys gone")

	dropKeys(t, s, redisKeys(t, s, ":i:*")) // the HTTP records lapsed
	for i, c := range calls {
		again := a.do("POST", c.path, keys[i], c.body)
		if again.Status != firsts[i].Status || !bytes.Equal(again.Raw, firsts[i].Raw) {
			t.Errorf("%s, HTTP record gone: %d %s, want %d %s", c.name, again.Status, again.Raw, firsts[i].Status, firsts[i].Raw)
		}
	}
	unchanged("HTTP records gone")

	// Racing twins of a retry whose HTTP record and op key are gone.
	dropKeys(t, s, redisKeys(t, s, ":i:*"))
	var wg sync.WaitGroup
	answers := make([]Response, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = a.do("POST", calls[consumeCall].path, keys[consumeCall], calls[consumeCall].body)
		}()
	}
	wg.Wait()
	for i, r := range answers {
		if r.Status != 200 || !bytes.Equal(r.Raw, firsts[consumeCall].Raw) {
			t.Errorf("twin %d: %d %s, want %s", i, r.Status, r.Raw, firsts[consumeCall].Raw)
		}
	}
	unchanged("racing twins")

	// Past the 24 h window.
	consumptions := len(a.history(id, "?type=consumption&limit=100"))
	promotional := len(a.history(id, "?source=promotional&limit=100"))
	dropKeys(t, s, redisKeys(t, s, ":i:*"))
	clock.Advance(25 * time.Hour)
	late := a.do("POST", calls[consumeCall].path, keys[consumeCall], calls[consumeCall].body)
	wantStatus(t, late, 200, "consume after 24 h")
	if r := late.Body["reason"]; r != "duplicate_replay" {
		t.Errorf("consume after 24 h: reason %v, want duplicate_replay", r)
	}
	got, want := withoutReason(t, late.Raw), withoutReason(t, firsts[consumeCall].Raw)
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if !bytes.Equal(gotJSON, wantJSON) {
		t.Errorf("consume after 24 h: %s, want the original numbers %s", gotJSON, wantJSON)
	}
	grant := a.do("POST", calls[0].path, keys[0], calls[0].body)
	if grant.Status != 201 || !bytes.Equal(grant.Raw, firsts[0].Raw) {
		t.Errorf("grant after 24 h: %d %s, want the first answer %s", grant.Status, grant.Raw, firsts[0].Raw)
	}
	s.Drain()
	if n := len(a.history(id, "?type=consumption&limit=100")); n != consumptions {
		t.Errorf("%d consumption entries after the late retries, want %d", n, consumptions)
	}
	if n := len(a.history(id, "?source=promotional&limit=100")); n != promotional {
		t.Errorf("%d promotional entries after the late retries, want %d", n, promotional)
	}
}
