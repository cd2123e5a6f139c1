package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// outboxDrained is the check `creditd reconcile` makes before it repairs a
// Redis ahead of Postgres: every outbox partition of s is empty.
func outboxDrained(s *Stack) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		parts, err := s.App.Persister.Partitions(ctx)
		if err != nil {
			return false, err
		}
		for _, p := range parts {
			if p.Depth > 0 {
				return false, nil
			}
		}
		return true, nil
	}
}

// reconcilePass runs a pass over s's stores as the CLI does (drain check
// on), limited to scope, repairing when repair is set.
func reconcilePass(t *testing.T, s *Stack, scope engine.ReconcileScope, repair bool) engine.ReconcileReport {
	t.Helper()
	rep, err := engine.Reconcile(context.Background(), persist.NewStore(s.Pool), lua.NewStore(s.Redis, s.Prefix),
		engine.ReconcileOptions{Fix: repair, PageSize: 2, Reported: 100, Scope: scope, Drained: outboxDrained(s)})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return rep
}

// firstBlockField is the name of one block field ("b:<id>") of an account
// hash, and its value.
func firstBlockField(t *testing.T, s *Stack, key string) (string, string) {
	t.Helper()
	fields, err := s.Redis.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for f := range fields {
		if strings.HasPrefix(f, "b:") {
			names = append(names, f)
		}
	}
	if len(names) == 0 {
		t.Fatalf("no block in %s", key)
	}
	sort.Strings(names)
	return names[0], fields[names[0]]
}

// withRemaining is block value v (lua/prelude/blocks.lua's block encoding) with
// remaining rem and its original kept: an untouched block leaves its
// original out ("rem||..."), which then reads as the remaining amount.
func withRemaining(t *testing.T, v string, rem int64) string {
	t.Helper()
	old, rest, ok := strings.Cut(v, "|")
	orig, tail, ok2 := strings.Cut(rest, "|")
	if !ok || !ok2 {
		t.Fatalf("block value %q", v)
	}
	if orig == "" {
		orig = old
	}
	return strconv.FormatInt(rem, 10) + "|" + orig + "|" + tail
}

// blockOfField is the block id of field "b:<id>" (compact) as UUID text.
func blockOfField(t *testing.T, f string) string {
	t.Helper()
	id, err := engine.ParseCompactID(strings.TrimPrefix(f, "b:"))
	if err != nil {
		t.Fatal(err)
	}
	return id.String()
}

// fieldOf finds a difference's field by name.
func fieldOf(d engine.Difference, name string) (engine.FieldDifference, bool) {
	for _, f := range d.Fields {
		if f.Field == name {
			return f, true
		}
	}
	return engine.FieldDifference{}, false
}

// TestReconcileRepairsExactlyTheCorrupted is issue 15's reconcile test.
// Customers of two tenants are built over HTTP and drained; then Redis is
// changed behind creditd's back for three customers of one tenant: a
// block's remaining amount rewritten, a block field deleted, the version
// bumped. A pass finds exactly those three (with the field and both
// values), counts the rest equal, and changes nothing; a pass scoped to
// the other tenant finds nothing; --repair reloads exactly those three from
// Postgres, fenced above the version Redis held (Postgres refuses those
// versions from then on), leaving every other account hash byte for byte
// as it was; then a pass finds nothing, every API balance equals its
// ledger, and a write on a repaired account persists.
func TestReconcileRepairsExactlyTheCorrupted(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	ctx := context.Background()
	tn, other := s.NewTenant("reconcile-repair"), s.NewTenant("reconcile-bystander")
	a, b := s.as(t, tn.Live), s.as(t, other.Live)
	var custs, bystanders []string
	for i := range 6 {
		id, _ := a.newCustomer()
		custs = append(custs, id)
		a.grant(id, map[string]any{"credits": 1000 + i})
		a.grant(id, map[string]any{"credits": 50, "priority": 2})
		wantStatus(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -100, "source": "manual", "reason": "use"}),
			200, "adjust")
	}
	for range 2 {
		id, _ := b.newCustomer()
		bystanders = append(bystanders, id)
		b.grant(id, map[string]any{"credits": 10})
	}
	s.Drain()
	tenantID := uuid.MustParse(tn.ID)
	scope := engine.ReconcileScope{TenantID: tenantID}
	if rep := reconcilePass(t, s, scope, false); rep.Checked != 6 || rep.Equal != 6 || rep.Found != 0 {
		t.Fatalf("clean pass: %+v %v", rep, rep.First)
	}

	// The corruptions, each on its own customer.
	amended, deleted, bumped := custs[1], custs[3], custs[4]
	amendedField, amendedValue := firstBlockField(t, s, accountKeyOf(s, amended))
	rem, _, _ := strings.Cut(amendedValue, "|")
	remaining, err := strconv.ParseInt(rem, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Redis.HSet(ctx, accountKeyOf(s, amended), amendedField, withRemaining(t, amendedValue, remaining+77)).Err(); err != nil {
		t.Fatal(err)
	}
	deletedField, _ := firstBlockField(t, s, accountKeyOf(s, deleted))
	if err := s.Redis.HDel(ctx, accountKeyOf(s, deleted), deletedField).Err(); err != nil {
		t.Fatal(err)
	}
	bumpedTo, err := s.Redis.HIncrBy(ctx, accountKeyOf(s, bumped), "v", 1).Result()
	if err != nil {
		t.Fatal(err)
	}
	corrupted := map[string]bool{amended: true, deleted: true, bumped: true}
	redisVersion := map[string]int64{}
	before := map[string]map[string]string{}
	for _, c := range append(append([]string(nil), custs...), bystanders...) {
		h, err := s.Redis.HGetAll(ctx, accountKeyOf(s, c)).Result()
		if err != nil {
			t.Fatal(err)
		}
		before[c] = h
		redisVersion[c], _ = strconv.ParseInt(h["v"], 10, 64)
	}

	check := func(rep engine.ReconcileReport, repaired bool, compared int64) {
		t.Helper()
		if rep.Checked != compared || rep.Equal != compared-3 || rep.Found != 3 || rep.NotLoaded != 0 {
			t.Fatalf("pass (repair %v): checked %d equal %d found %d missing %d; want %d, %d, 3, 0: %v",
				repaired, rep.Checked, rep.Equal, rep.Found, rep.NotLoaded, compared, compared-3, rep.First)
		}
		want := int64(0)
		if repaired {
			want = 3
		}
		if rep.Fixed != want {
			t.Fatalf("pass (repair %v): %d repaired, want %d: %v", repaired, rep.Fixed, want, rep.First)
		}
		for _, d := range rep.First {
			c := d.Customer.CustomerID.String()
			if !corrupted[c] || d.Customer.TenantID != tenantID {
				t.Fatalf("pass reports customer %s, not one of the corrupted: %s", c, d)
			}
			var name, wantRedis, wantPG string
			switch c {
			case amended:
				name = "block " + blockOfField(t, amendedField) + " remaining"
				wantRedis, wantPG = strconv.FormatInt(remaining+77, 10), strconv.FormatInt(remaining, 10)
			case deleted:
				name, wantRedis = "block "+blockOfField(t, deletedField), "absent"
			case bumped:
				name = "version"
				wantRedis, wantPG = strconv.FormatInt(bumpedTo, 10), strconv.FormatInt(bumpedTo-1, 10)
			}
			f, ok := fieldOf(d, name)
			if !ok || f.Redis != wantRedis || (wantPG != "" && f.Postgres != wantPG) {
				t.Fatalf("customer %s: field %q = %+v (found %v), want redis %q postgres %q; all: %+v", c, name, f, ok,
					wantRedis, wantPG, d.Fields)
			}
			if c == amended {
				if f, ok := fieldOf(d, "balance"); !ok || f.Redis == f.Postgres {
					t.Fatalf("customer %s: no balance difference: %+v", c, d.Fields)
				}
			}
		}
	}
	check(reconcilePass(t, s, scope, false), false, 6)
	check(reconcilePass(t, s, engine.ReconcileScope{}, false), false, 8) // every tenant: the bystanders are equal
	if rep := reconcilePass(t, s, engine.ReconcileScope{TenantID: uuid.MustParse(other.ID)}, false); rep.Checked != 2 || rep.Found != 0 {
		t.Fatalf("pass scoped to the other tenant: %+v %v", rep, rep.First)
	}
	if rep := reconcilePass(t, s, engine.ReconcileScope{TenantID: tenantID, Environment: engine.EnvironmentSandbox}, false); rep.Checked != 0 {
		t.Fatalf("pass scoped to the sandbox: %+v", rep)
	}
	for c, h := range before {
		if now, _ := s.Redis.HGetAll(ctx, accountKeyOf(s, c)).Result(); fmt.Sprint(now) != fmt.Sprint(h) {
			t.Fatalf("a pass without --repair changed customer %s", c)
		}
	}

	check(reconcilePass(t, s, scope, true), true, 6)
	if rep := reconcilePass(t, s, engine.ReconcileScope{}, false); rep.Found != 0 || rep.Equal != 8 {
		t.Fatalf("pass after --repair: %+v %v", rep, rep.First)
	}
	for c, h := range before {
		now, err := s.Redis.HGetAll(ctx, accountKeyOf(s, c)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if !corrupted[c] {
			if fmt.Sprint(now) != fmt.Sprint(h) {
				t.Fatalf("--repair touched customer %s, which was not corrupted", c)
			}
			continue
		}
		v, _ := strconv.ParseInt(now["v"], 10, 64)
		var fenced *int64
		if err := s.Pool.QueryRow(ctx, `SELECT fenced_version FROM credit_accounts WHERE customer_id = $1`, c).Scan(&fenced); err != nil {
			t.Fatal(err)
		}
		if v <= redisVersion[c] || fenced == nil || *fenced < redisVersion[c] {
			t.Fatalf("customer %s repaired to version %d, fence %v; want both above the corrupted version %d", c, v, fenced, redisVersion[c])
		}
	}
	for _, c := range custs {
		if bal, sum := a.balance(c), ledgerSum(a, c); bal != sum {
			t.Fatalf("customer %s: API balance %d, ledger sum %d", c, bal, sum)
		}
	}
	for c := range corrupted {
		wantStatus(t, a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": -1, "source": "manual", "reason": "after"}),
			200, "adjust after repair")
	}
	s.Drain()
	if rep := reconcilePass(t, s, engine.ReconcileScope{}, false); rep.Found != 0 {
		t.Fatalf("pass after writes on the repaired accounts: %v", rep.First)
	}
}

// metricValue reads one unlabelled sample of /metrics (-1: absent).
func metricValue(t *testing.T, s *Stack, name string) float64 {
	t.Helper()
	res, err := http.Get(s.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// TestReconcileSamplerCountsMismatches: with the sampler on (every 100 ms,
// 50 customers), a clean stack counts checked customers and no mismatch in
// /metrics; after a block amount is rewritten in Redis behind creditd's
// back, and a version bumped (Redis ahead of Postgres with nothing in the
// outbox), /metrics counts mismatches, the last-sample gauge shows them,
// the log names exactly those customers, and neither is repaired (the
// sampler only reports).
func TestReconcileSamplerCountsMismatches(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	s := NewStack(t, WithLog(&logs), WithConfig(func(c *app.Config) {
		c.ReconcileSample, c.ReconcileSampleInterval = 50, 100*time.Millisecond
	}))
	ctx := context.Background()
	a := s.as(t, s.NewTenant("reconcile-sampler").Live)
	var custs []string
	for i := range 4 {
		id, _ := a.newCustomer()
		custs = append(custs, id)
		a.grant(id, map[string]any{"credits": 500 + i})
	}
	s.Drain()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s; log:\n%s", what, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	checkedBefore := 0.0
	waitFor("checked customers", func() bool {
		checkedBefore = metricValue(t, s, "creditd_reconcile_checked_total")
		return checkedBefore >= 4
	})
	if n := metricValue(t, s, "creditd_reconcile_mismatches_total"); n != 0 {
		t.Fatalf("clean stack: %v mismatches; log:\n%s", n, logs.String())
	}

	amended, bumped := custs[0], custs[2]
	field, value := firstBlockField(t, s, accountKeyOf(s, amended))
	rem, _, _ := strings.Cut(value, "|")
	n, _ := strconv.ParseInt(rem, 10, 64)
	if err := s.Redis.HSet(ctx, accountKeyOf(s, amended), field, withRemaining(t, value, n-3)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Redis.HIncrBy(ctx, accountKeyOf(s, bumped), "v", 1).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor("both mismatches logged and counted", func() bool {
		l := logs.String()
		return strings.Contains(l, amended) && strings.Contains(l, bumped) &&
			metricValue(t, s, "creditd_reconcile_mismatches_total") >= 2 &&
			metricValue(t, s, "creditd_reconcile_last_sample_mismatches") >= 1
	})
	for _, c := range []string{custs[1], custs[3]} {
		if strings.Contains(logs.String(), c) {
			t.Fatalf("the log names customer %s, which was not corrupted:\n%s", c, logs.String())
		}
	}
	if metricValue(t, s, "creditd_reconcile_checked_total") <= checkedBefore {
		t.Fatal("creditd_reconcile_checked_total did not move")
	}
	// Still corrupted: the sampler never repairs.
	if got, _ := s.Redis.HGet(ctx, accountKeyOf(s, amended), field).Result(); !strings.HasPrefix(got, strconv.FormatInt(n-3, 10)+"|") {
		t.Fatalf("the sampler changed the corrupted block: %q", got)
	}
	if rep := reconcilePass(t, s, engine.ReconcileScope{}, false); rep.Found != 2 {
		t.Fatalf("reconcile after the sampler: %d differences, want the 2 corrupted: %v", rep.Found, rep.First)
	}
}
