package e2e

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// TestReplicaAckedConsume protects "acknowledged = durable" across a
// failover (issue 11.3): on a master with a replica (auto mode waits for
// one), a consume answers 2xx once the replica has it; with the replica
// stalled the same consume applies on the master but answers 503 with
// Retry-After, and the retry with its Idempotency-Key, once the replica is
// back, answers 2xx (and later retries replay that body) with the balance
// moved once.
func TestReplicaAckedConsume(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedisServer(t)
	replica := testenv.StartRedisReplica(t, master)
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: StackRedisPoolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStack(t, WithRedis(rdb, "ra"+testenv.RandomSuffix()))
	tn := s.NewTenant(uniq("replica"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(100)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	body := map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 3}

	wantStatus(t, a.do("POST", "/v1/entitlements/consume", idemKey(), body), 200, "consume with the replica up")

	replica.Pause()
	key := idemKey()
	r := a.do("POST", "/v1/entitlements/consume", key, body)
	checkProblem(t, r, 503, "unavailable", "", "consume with the replica stalled")
	if r.Header.Get("Retry-After") != "1" {
		t.Errorf("503 Retry-After %q, want 1", r.Header.Get("Retry-After"))
	}
	// Still stalled: the retry replays the applied op, and is still not
	// acknowledged.
	checkProblem(t, a.do("POST", "/v1/entitlements/consume", key, body), 503, "unavailable", "", "retry with the replica stalled")

	replica.Resume()
	var ok Response
	for deadline := time.Now().Add(10 * time.Second); ; {
		ok = a.do("POST", "/v1/entitlements/consume", key, body)
		if ok.Status != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantStatus(t, ok, 200, "retry with the replica back")
	if Int(t, ok.Body["balance_after"]) != 400 || Int(t, ok.Body["charged"]) != 300 {
		t.Errorf("retry body: %s", ok.Raw)
	}
	again := a.do("POST", "/v1/entitlements/consume", key, body)
	wantStatus(t, again, 200, "second retry")
	if string(again.Raw) != string(ok.Raw) {
		t.Errorf("second retry %s, first 2xx %s", again.Raw, ok.Raw)
	}
	if b := a.balance(id); b != 400 {
		t.Errorf("balance %d, want 400 (each consume charged once)", b)
	}
	s.Drain()
	if h := a.history(id, "?type=consumption"); len(h) != 2 {
		t.Errorf("consumption entries %d, want 2", len(h))
	}
}
