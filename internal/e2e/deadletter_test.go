package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/creditd/creditd/persist"
)

// syncBuffer collects a stack's logs across its goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDeadLetterAlarmAndReplay states invariant 12's "a dead letter is an
// alarm, never a normal path" end to end. A grant Postgres refuses (a
// temporary CHECK constraint stands in for any value the door should have
// refused) is answered 201 by Redis; then /readyz names it under
// dead_letters and still answers 200 (issue 25: an alarm, never a
// readiness failure, or every node would leave the balancer at once),
// /metrics counts it, the log names its op, tenant, customer
// and SQLSTATE, and the customer's later consume is held behind it. Once
// Postgres accepts again, the retry the CLI runs replays both in order:
// Postgres matches Redis exactly (balance, version, blocks, ledger), the
// alarm clears, and a second retry changes nothing.
func TestDeadLetterAlarmAndReplay(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	s := NewStack(t, SingleNode(), WithLog(&logs))
	ctx := context.Background()
	tn := s.NewTenant(uniq("deadletter"))
	a := s.as(t, tn.Live)
	metric := uniq("calls")
	wantStatus(t, a.post("/v1/metering-rules", map[string]any{
		"billable_metric_key": metric, "cost_type": "per_unit", "unit_cost": 3}), 201, "rule")
	cust, _ := a.newCustomer()
	bystander, _ := a.newCustomer()
	a.grant(cust, map[string]any{"credits": 100})
	s.Drain()
	balanceBefore := a.balance(cust)
	wantReady(t, s, true, "")

	poison := uniq("poison")
	if _, err := s.Pool.Exec(ctx, `ALTER TABLE ledger_entries ADD CONSTRAINT test_refuse
		CHECK (reason IS DISTINCT FROM '`+poison+`') NOT VALID`); err != nil {
		t.Fatal(err)
	}
	a.grant(cust, map[string]any{"credits": 50, "reason": poison})
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{
		"customer_id": cust, "billable_metric_key": metric, "units": 7}), 200, "consume behind the dead letter")
	a.grant(bystander, map[string]any{"credits": 9})
	s.Drain()

	// The alarm.
	wantReady(t, s, false, "2 unresolved dead letters")
	wantMetric(t, s, "creditd_dead_letters_unresolved", 2)
	wantMetric(t, s, "creditd_persister_dead_letters_total", 2)
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"sqlstate":"23514"`) {
			line = l
		}
	}
	for _, want := range []string{`"level":"error"`, `"tenant_id":"` + tn.ID + `"`, `"customer_id":"` + cust + `"`, `"op_id":"`} {
		if !strings.Contains(line, want) {
			t.Errorf("dead-letter log line lacks %s: %q", want, line)
		}
	}
	list, total, err := s.App.DB.ListDeadLetters(ctx, 10)
	if err != nil || total != 2 || len(list) != 2 || list[0].SQLState == nil || *list[0].SQLState != "23514" ||
		list[1].HeldBy == nil || *list[1].HeldBy != list[0].ID {
		t.Fatalf("dead letters = %+v (%d), %v", list, total, err)
	}
	if list[0].OpID == nil || !strings.Contains(line, `"op_id":"`+list[0].OpID.String()+`"`) {
		t.Errorf("log line %q does not name op %v", line, list[0].OpID)
	}
	// Held, not half-written: Postgres keeps the customer balanced as it
	// stood before the refused grant; the bystander moved on.
	wantPostgresBooks(t, s, cust, balanceBefore)
	wantBooksMatchRedis(t, s, a, bystander)

	if _, err := s.Pool.Exec(ctx, `ALTER TABLE ledger_entries DROP CONSTRAINT test_refuse`); err != nil {
		t.Fatal(err)
	}
	out, err := s.App.DB.RetryAllDeadLetters(ctx, persist.RetryOptions{})
	if err != nil || len(out) != 2 || out[0].Status != persist.RetryResolved || out[1].Status != persist.RetryResolved {
		t.Fatalf("retry = %+v, %v", out, err)
	}
	wantBooksMatchRedis(t, s, a, cust)
	wantReady(t, s, true, "")
	wantMetric(t, s, "creditd_dead_letters_unresolved", 0)

	var entries int
	count := func() int {
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE customer_id = $1`, cust).Scan(&entries); err != nil {
			t.Fatal(err)
		}
		return entries
	}
	before := count()
	if out, err := s.App.DB.RetryAllDeadLetters(ctx, persist.RetryOptions{}); err != nil || len(out) != 0 {
		t.Fatalf("second retry = %+v, %v", out, err)
	}
	out, err = s.App.DB.RetryDeadLetters(ctx, []int64{list[0].ID, list[1].ID}, persist.RetryOptions{})
	if err != nil || out[0].Status != persist.RetryAlreadyResolved || out[1].Status != persist.RetryAlreadyResolved {
		t.Fatalf("retry of resolved ids = %+v, %v", out, err)
	}
	if after := count(); after != before {
		t.Fatalf("a second retry wrote %d ledger entries", after-before)
	}
	wantBooksMatchRedis(t, s, a, cust)

	// The reservation is lifted: the next grant goes straight to Postgres.
	a.grant(cust, map[string]any{"credits": 1})
	s.Drain()
	wantBooksMatchRedis(t, s, a, cust)
	wantMetric(t, s, "creditd_persister_dead_letters_total", 2)
}

// wantReady asserts /readyz answers 200 "ready" whatever the dead
// letters, and that its dead_letters check is "ok" when clear, else says
// detail.
func wantReady(t *testing.T, s *Stack, clear bool, detail string) {
	t.Helper()
	r := Call(t, s.HTTP, s.URL, "GET", "/readyz", nil)
	checks, _ := r.Body["checks"].(map[string]any)
	got, _ := checks["dead_letters"].(string)
	switch {
	case r.Status != 200 || r.Body["status"] != "ready":
		t.Fatalf("/readyz = %d %s, want 200 ready (a dead letter is an alarm, not a readiness failure)", r.Status, r.Raw)
	case clear && got != "ok":
		t.Fatalf("/readyz = %d %s, want dead_letters ok", r.Status, r.Raw)
	case !clear && !strings.Contains(got, detail):
		t.Fatalf("/readyz = %d %s, want dead_letters %q", r.Status, r.Raw, detail)
	}
}

// wantMetric asserts one sample of /metrics.
func wantMetric(t *testing.T, s *Stack, name string, want int64) {
	t.Helper()
	r := Call(t, s.HTTP, s.URL, "GET", "/metrics", nil)
	for _, l := range strings.Split(string(r.Raw), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n != want {
				t.Fatalf("%s = %s, want %d", name, v, want)
			}
			return
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", name, r.Raw)
}

// wantPostgresBooks asserts customer's account row, live blocks and
// ledger in Postgres all say balance.
func wantPostgresBooks(t *testing.T, s *Stack, customer string, balance int64) {
	t.Helper()
	var row, blocks, ledger int64
	err := s.Pool.QueryRow(context.Background(), `SELECT a.balance,
		(SELECT COALESCE(SUM(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1),
		(SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1)
		FROM credit_accounts a WHERE a.customer_id = $1`, customer).Scan(&row, &blocks, &ledger)
	if err != nil {
		t.Fatal(err)
	}
	if row != balance || blocks != balance || ledger != balance {
		t.Fatalf("Postgres books of %s: account %d, blocks %d, ledger %d; want %d", customer, row, blocks, ledger, balance)
	}
}

// wantBooksMatchRedis asserts Postgres holds customer exactly as Redis
// does: balance, reserved, version, each block's remaining amount, and a
// ledger summing to the balance.
func wantBooksMatchRedis(t *testing.T, s *Stack, a api, customer string) {
	t.Helper()
	c := a.credits(customer)
	balance := Int(t, c["balance"])
	wantPostgresBooks(t, s, customer, balance)
	ctx := context.Background()
	v, err := s.Redis.HGet(ctx, accountKey(s.Prefix, customer), "v").Result()
	if err != nil {
		t.Fatal(err)
	}
	var pgVersion, reserved int64
	if err := s.Pool.QueryRow(ctx, `SELECT version, reserved_balance FROM credit_accounts WHERE customer_id = $1`,
		customer).Scan(&pgVersion, &reserved); err != nil {
		t.Fatal(err)
	}
	if v != fmt.Sprint(pgVersion) || reserved != Int(t, c["reserved_balance"]) {
		t.Fatalf("version Redis %s, Postgres %d; reserved Redis %v, Postgres %d", v, pgVersion, c["reserved_balance"], reserved)
	}
	for _, b := range arr(t, c["blocks"], "blocks") {
		blk := obj(t, b, "block")
		var remaining int64
		if err := s.Pool.QueryRow(ctx, `SELECT remaining_amount FROM credit_blocks WHERE id = $1`, blk["id"]).Scan(&remaining); err != nil {
			t.Fatalf("block %v: %v", blk["id"], err)
		}
		if remaining != Int(t, blk["remaining_amount"]) {
			t.Fatalf("block %v: remaining Redis %v, Postgres %d", blk["id"], blk["remaining_amount"], remaining)
		}
	}
}
