package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// addNode starts another creditd node on s's Redis prefix and database,
// with s's configuration under its own persister consumer name and its
// background work on. It returns the node's App and a Stack value that
// speaks to it.
func (s *Stack) addNode(t *testing.T, consumer string) (*app.App, *Stack) {
	t.Helper()
	pool, err := persist.Open(context.Background(), s.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.Config
	cfg.Consumer = consumer
	a := app.New(s.Redis, pool, cfg, zerolog.New(io.Discard))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	go func() { _ = a.Serve(ln) }()
	t.Cleanup(func() {
		a.Stop(0)
		pool.Close()
	})
	node := *s
	node.App, node.URL = a, "http://"+ln.Addr().String()
	return a, &node
}

// countingReceiver is a webhook endpoint that counts deliveries per
// webhook-id and remembers when each id first arrived.
type countingReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	count map[string]int
	first map[string]time.Time
}

func newCountingReceiver(t testing.TB) *countingReceiver {
	r := &countingReceiver{count: map[string]int{}, first: map[string]time.Time{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		id := req.Header.Get("webhook-id")
		r.mu.Lock()
		if r.count[id] == 0 {
			r.first[id] = time.Now()
		}
		r.count[id]++
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// deliveries copies the per-id counts and first arrivals.
func (r *countingReceiver) deliveries() (map[string]int, map[string]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	count, first := map[string]int{}, map[string]time.Time{}
	for k, v := range r.count {
		count[k], first[k] = v, r.first[k]
	}
	return count, first
}

// sqlInt runs a one-number query on the stack's database.
func (s *Stack) sqlInt(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := s.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// TestFleetBackgroundOnce (issue 11.4): three nodes on one Redis and one
// Postgres run every background job at once, racing for the same work.
// Each effect happens exactly once: one expiry ledger entry per expired
// block, one release entry per expired reservation, one ledger write per
// operation whichever node's persister read it, and one webhook delivery
// per event. (The scheduler's once-per-period grants across processes are
// TestSchedulerTwoProcessesCatchUp.)
func TestFleetBackgroundOnce(t *testing.T) {
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	clock := newSettableClock(t0)
	s := NewStack(t, WithClock(clock), WithReservationSweep(20*time.Millisecond), WithConfig(func(c *app.Config) {
		c.SweepInterval, c.WebhookPoll = 20*time.Millisecond, 20*time.Millisecond
	}))
	_, n2 := s.addNode(t, "e2e-2")
	_, n3 := s.addNode(t, "e2e-3")
	tn := s.NewTenant(uniq("fleetbg"))
	rcv := newCountingReceiver(t)
	wantStatus(t, adminCall(t, s, AdminToken, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": rcv.srv.URL}), 200, "PUT webhook")
	nodes := []api{s.as(t, tn.Live), n2.as(t, tn.Live), n3.as(t, tn.Live)}
	metric := nodes[0].perUnit(5)

	const customers, consumes = 6, 6
	ids := make([]string, customers)
	reservations := make([]string, customers)
	for i := range ids {
		on := func(j int) api { return nodes[(i+j)%len(nodes)] }
		ids[i], _ = on(0).newCustomer()
		on(1).grant(ids[i], map[string]any{"credits": 100, "expires_at": t0.Add(time.Hour).Format(time.RFC3339Nano)})
		on(2).grant(ids[i], map[string]any{"credits": 1000})
		reservations[i] = str(t, on(0).reserve(map[string]any{"customer_id": ids[i], "billable_metric_key": metric,
			"estimated_units": 2, "ttl_seconds": 60})["id"], "reservation id")
		for j := range consumes {
			r := on(j).post("/v1/entitlements/consume", map[string]any{"customer_id": ids[i], "billable_metric_key": metric, "units": 1})
			wantStatus(t, r, 200, "consume")
		}
	}

	// Every event so far delivered first: a claim's lease runs on the
	// injected clock, so an attempt under way across the jump would see its
	// lease lapse and the event claimed again (as a node would whose clock
	// jumped by more than the lease).
	s.Drain()
	eventually(t, "the events so far delivered", func() bool {
		return s.sqlInt(t, `SELECT count(*) FROM `+storedEventsSQL+` WHERE tenant_id = $1 AND status <> 'delivered'`, tn.ID) == 0
	})

	// Two hours on: every node's expiry and reservation sweeps find the same due
	// blocks and reservations.
	clock.Set(t0.Add(2 * time.Hour))
	a := nodes[0]
	for i, id := range ids {
		eventually(t, "reservation expired and block expired", func() bool {
			h := a.get("/v1/reservations/" + reservations[i])
			return h.Status == 200 && h.Body["status"] == "expired" && a.balance(id) == 1000
		})
	}
	// Let a straggling duplicate show itself before counting.
	time.Sleep(300 * time.Millisecond)
	s.Drain()
	for i, id := range ids {
		if n := s.sqlInt(t, `SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND type = 'expiry'`, id); n != 1 {
			t.Errorf("customer %s: %d expiry entries, want 1", id, n)
		}
		if d := s.sqlInt(t, `SELECT COALESCE(sum(delta), 0) FROM ledger_entries WHERE customer_id = $1 AND type = 'expiry'`, id); d != -70 {
			t.Errorf("customer %s: expired %d, want -70 (100 granted, 30 consumed)", id, d)
		}
		if n := s.sqlInt(t, `SELECT count(*) FROM ledger_entries WHERE type = 'release' AND reference_id = $1`, reservations[i]); n != 1 {
			t.Errorf("hold %s: %d release entries, want 1", reservations[i], n)
		}
		if n := s.sqlInt(t, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption'`, id); n != consumes {
			t.Errorf("customer %s: %d consumptions, want %d", id, n, consumes)
		}
		if sum := s.sqlInt(t, `SELECT COALESCE(sum(delta), 0) FROM ledger_entries WHERE customer_id = $1`, id); sum != 1000 {
			t.Errorf("customer %s: ledger sums to %d, balance 1000", id, sum)
		}
	}

	// Every event the persisters wrote is delivered once, by whichever
	// node claimed it (a consume's, carried by its ledger entry, once a
	// claim has copied it into a row: persist/carried.go).
	events := s.sqlInt(t, `SELECT count(*) FROM `+storedEventsSQL+` WHERE tenant_id = $1`, tn.ID)
	if events == 0 {
		t.Fatal("no webhook events")
	}
	eventually(t, "every event delivered", func() bool {
		return s.sqlInt(t, `SELECT count(*) FROM `+storedEventsSQL+` WHERE tenant_id = $1 AND status = 'delivered'`, tn.ID) == events
	})
	time.Sleep(200 * time.Millisecond)
	count, _ := rcv.deliveries()
	if int64(len(count)) != events {
		t.Errorf("receiver saw %d event ids, %d events stored", len(count), events)
	}
	for id, n := range count {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
	if n := s.sqlInt(t, `SELECT count(*) FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id WHERE e.tenant_id = $1`, tn.ID); n != events {
		t.Errorf("%d delivery attempts recorded for %d events", n, events)
	}
}

// takeoverSlack is what a loaded test machine may add to a takeover bound
// (scheduling, a Postgres commit, the poll that notices).
const takeoverSlack = 3 * time.Second

// TestFleetTakeover (issue 11.4): a node killed mid-batch leaves outbox
// messages read but not acknowledged and webhook events claimed but not
// attempted (staged here exactly as kill -9 leaves them: a consumer "dead"
// reads every message, a claim leases every due event, and nothing more
// happens; it owned every outbox partition). Another node takes both over
// within the stated bounds, not before: the messages once the dead node's
// partition leases lapse (OutboxClaimIdle, looked for every third of it),
// the events once their lease lapses; each lands once.
func TestFleetTakeover(t *testing.T) {
	const claimIdle, lease = 600 * time.Millisecond, time.Second
	s := NewStack(t, WithoutStart(), WithConfig(func(c *app.Config) {
		c.OutboxClaimIdle, c.WebhookLease, c.WebhookPoll = claimIdle, lease, 20*time.Millisecond
	}))
	tn := s.NewTenant(uniq("takeover"))
	rcv := newCountingReceiver(t)
	wantStatus(t, adminCall(t, s, AdminToken, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": rcv.srv.URL}), 200, "PUT webhook")
	a := s.as(t, tn.Live)
	metric := a.perUnit(1)
	const customers, consumes, pings = 4, 3, 3
	for range customers {
		id, _ := a.newCustomer()
		a.grant(id, map[string]any{"credits": 100})
		for range consumes {
			wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 1}), 200, "consume")
		}
	}
	pingIDs := map[string]bool{}
	for range pings {
		r := a.do("POST", "/v1/webhooks/test", idemKey(), nil)
		wantStatus(t, r, 202, "test ping")
		pingIDs[str(t, r.Body["event_id"], "event_id")] = true
	}

	// The dead node's last moments.
	ctx := context.Background()
	dead := lua.NewStore(s.Redis, s.Prefix)
	read := 0
	for p := range lua.Partitions {
		msgs, err := dead.Read(ctx, p, "dead", 1000, 0)
		if err != nil {
			t.Fatal(err)
		}
		read += len(msgs)
	}
	claims, err := s.App.DB.ClaimDue(ctx, time.Now(), lease, 100, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	// It owned every partition (issue 25): its leases lapse OutboxClaimIdle
	// after their last renewal, here.
	for p := range lua.Partitions {
		if _, ok, err := dead.TakePartition(ctx, p, "dead", claimIdle); err != nil || !ok {
			t.Fatalf("the dead node's lease of partition %d: %v %v", p, ok, err)
		}
	}
	diedAt := time.Now()
	if ops := customers * (1 + consumes); read != ops || len(claims) != pings {
		t.Fatalf("the dead node read %d messages (want %d) and claimed %d events (want %d)", read, ops, len(claims), pings)
	}

	s.App.Start()
	ops := int64(customers * (1 + consumes))
	eventually(t, "the dead node's messages persisted", func() bool {
		return s.sqlInt(t, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE tenant_id = $1`, tn.ID) == ops
	})
	persisted := time.Since(diedAt)
	if persisted < claimIdle-50*time.Millisecond || persisted > claimIdle+claimIdle/3+takeoverSlack {
		t.Errorf("messages persisted %s after the death: want between the claim idle %s and %s (+%s slack)",
			persisted, claimIdle, claimIdle+claimIdle/3, takeoverSlack)
	}
	eventually(t, "the dead node's events delivered", func() bool {
		count, _ := rcv.deliveries()
		for id := range pingIDs {
			if count[id] == 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(200 * time.Millisecond)
	count, first := rcv.deliveries()
	var last time.Duration
	for id := range pingIDs {
		after := first[id].Sub(diedAt)
		last = max(last, after)
		if count[id] != 1 {
			t.Errorf("event %s delivered %d times", id, count[id])
		}
		if after < lease-50*time.Millisecond || after > lease+takeoverSlack {
			t.Errorf("event %s delivered %s after the death: want after its %s lease, within %s", id, after, lease, takeoverSlack)
		}
	}
	if m := s.sqlInt(t, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1`, tn.ID); m != ops {
		t.Errorf("%d ledger entries, want %d (one per operation)", m, ops)
	}
	t.Logf("takeover: messages persisted %s after the death (claim idle %s), events delivered by %s after it (lease %s)",
		persisted.Round(time.Millisecond), claimIdle, last.Round(time.Millisecond), lease)
}

// errKilled stands for a scheduler node dying before its transaction
// commits.
var errKilled = errors.New("node killed before its commit")

// killedScheduler is a scheduler node's subscription store that dies right
// after a firing's work: change runs (its grants reach Redis), then the
// transaction rolls back as a kill -9 of the node would make Postgres roll
// it back, leaving the subscription as it was.
type killedScheduler struct {
	*persist.Store
	fired atomic.Int64
}

// RunDue implements engine.SubscriptionStore.
func (k *killedScheduler) RunDue(ctx context.Context, now time.Time, limit int, change func(context.Context, *engine.SubscriptionRecord) error) (int, error) {
	return k.Store.RunDue(ctx, now, limit, func(ctx context.Context, r *engine.SubscriptionRecord) error {
		if err := change(ctx, r); err != nil {
			return err
		}
		k.fired.Add(1)
		return errKilled
	})
}

// TestSchedulerKilledMidFiring (issue 11.4): a scheduler node fires a due
// renewal (the plan grant lands in Redis) and dies before its Postgres
// commit; the row lock goes with its session, and another node's next pass
// fires the same renewal again: the grant replays under its firing's key,
// so the customer is granted once for the period and the subscription
// moves on once.
func TestSchedulerKilledMidFiring(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := newSettableClock(t0)
	s := NewStack(t, WithClock(clock), WithSchedulerInterval(20*time.Millisecond), WithoutStart())
	tn := s.NewTenant(uniq("killed-sched"))
	a := s.as(t, tn.Live)
	plan := str(t, a.newPlan(map[string]any{"name": "Daily"})["id"], "plan")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "daily", "billing_mode": "postpaid"})["id"], "variant")
	a.newGrant(plan, vid, map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring"})
	cust, _ := a.newCustomer()
	r := a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid})
	wantStatus(t, r, 201, "create")
	sub := str(t, r.Body["id"], "id")
	if b := a.balance(cust); b != 1000 {
		t.Fatalf("balance at start %d, want 1000", b)
	}

	// The dying node: its scheduler fires the renewal, then dies.
	clock.Set(t0.AddDate(0, 0, 1).Add(time.Minute))
	app1 := s.App
	dying := &killedScheduler{Store: app1.DB}
	subs := engine.NewSubscriptions(app1.PlanFacts.ForgettingSubscriptions(dying), app1.Plans, app1.Customers, app1.Credits, app1.Store, app1.Store, clock, zerolog.New(io.Discard))
	(&engine.Scheduler{Subscriptions: subs, Clock: clock, Log: zerolog.New(io.Discard)}).RunOnce(context.Background())
	if dying.fired.Load() != 1 {
		t.Fatalf("the dying node fired %d subscriptions, want 1", dying.fired.Load())
	}
	if b := a.balance(cust); b != 2000 {
		t.Fatalf("balance after the dying node's firing %d, want 2000 (its grant reached Redis)", b)
	}
	if start := mustTime(t, a.subscription(sub)["current_period_start"]); !start.Equal(t0) {
		t.Fatalf("period start %s after the rollback, want %s", start, t0)
	}

	// The surviving node takes the subscription over on its next pass.
	s.App.Start()
	eventually(t, "the renewal", func() bool {
		return mustTime(t, a.subscription(sub)["current_period_start"]).Equal(t0.AddDate(0, 0, 1))
	})
	time.Sleep(200 * time.Millisecond)
	if b := a.balance(cust); b != 2000 {
		t.Errorf("balance %d after the takeover, want 2000 (one grant per period)", b)
	}
	s.Drain()
	if g := a.history(cust, "?type=plan_grant&limit=100"); len(g) != 2 {
		t.Errorf("%d plan_grant entries, want 2", len(g))
	}
	if n := len(a.subEvents("subscription.renewed", cust)); n != 1 {
		t.Errorf("%d subscription.renewed events, want 1", n)
	}
}

// slowWriter is a node's Postgres side that takes delay over each of its
// first slow Applies (a busy Postgres), or fails them after it when fail is
// set, and records every op id it wrote.
type slowWriter struct {
	inner engine.LedgerWriter
	delay time.Duration
	slow  atomic.Int64
	fail  bool
	// started is closed when the first Apply begins.
	started chan struct{}
	once    sync.Once
	mu      sync.Mutex
	ops     map[string]int
}

func newSlowWriter(inner engine.LedgerWriter, delay time.Duration, slow int64, fail bool) *slowWriter {
	w := &slowWriter{inner: inner, delay: delay, fail: fail, started: make(chan struct{}), ops: map[string]int{}}
	w.slow.Store(slow)
	return w
}

// Apply implements engine.LedgerWriter.
func (w *slowWriter) Apply(ctx context.Context, ms []engine.Mutation) error {
	w.once.Do(func() { close(w.started) })
	if w.slow.Add(-1) >= 0 {
		select {
		case <-time.After(w.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
		if w.fail {
			return errors.New("postgres unreachable from this node")
		}
	}
	if err := w.inner.Apply(ctx, ms); err != nil {
		return err
	}
	w.mu.Lock()
	for _, m := range ms {
		w.ops[m.OpID.String()]++
	}
	w.mu.Unlock()
	return nil
}

// written is the op ids w committed.
func (w *slowWriter) written() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for k, v := range w.ops {
		out[k] = v
	}
	return out
}

// TestPersisterRenewsSlowBatch (issue 11.4): a node whose batch waits on a
// busy Postgres for three times the claim idle keeps it (it renews the
// messages while it works), so no other node writes it a second time; a
// node whose write fails stops renewing, and another node takes the batch
// over after the claim idle and writes it.
func TestPersisterRenewsSlowBatch(t *testing.T) {
	const claimIdle = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		fail bool
	}{{"slow", false}, {"failing", true}} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStack(t, WithoutStart())
			tn := s.NewTenant(uniq("renew"))
			a := s.as(t, tn.Live)
			const ops = 6
			id, _ := a.newCustomer()
			for range ops {
				a.grant(id, map[string]any{"credits": 10})
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			run := func(consumer string, w *slowWriter) *persist.Persister {
				per := persist.NewPersister(lua.NewStore(s.Redis, s.Prefix), w, persist.PersisterConfig{
					Consumer: consumer, ClaimIdle: claimIdle, Block: 10 * time.Millisecond}, zerolog.New(io.Discard))
				go func() { _ = per.Run(ctx) }()
				return per
			}
			slow := int64(1) // one busy write, then it commits
			if tc.fail {
				slow = 1 << 20 // every write fails, after the delay
			}
			first := newSlowWriter(s.App.DB, 3*claimIdle, slow, tc.fail)
			per := run("first", first)
			<-first.started
			second := newSlowWriter(s.App.DB, 0, 0, false)
			run("second", second)
			if err := per.Drain(ctx, 30*time.Second); err != nil {
				t.Fatal(err)
			}
			one, two := first.written(), second.written()
			if len(one)+len(two) < ops {
				t.Fatalf("%d + %d ops written, want %d", len(one), len(two), ops)
			}
			both := 0
			for op := range one {
				if two[op] > 0 {
					both++
				}
			}
			switch {
			case !tc.fail && (both > 0 || len(one) != ops):
				t.Errorf("the slow node wrote %d ops, the other %d, %d of them twice: want all by the slow node, none twice", len(one), len(two), both)
			case tc.fail && len(two) != ops:
				t.Errorf("after the failed write the other node wrote %d ops, want %d", len(two), ops)
			}
			if n := s.sqlInt(t, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1`, id); n != ops {
				t.Errorf("%d ops in the ledger, want %d", n, ops)
			}
		})
	}
}
