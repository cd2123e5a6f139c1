package e2e

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// scoped is an applies_to member naming keys.
func scoped(keys ...string) map[string]any {
	ks := make([]any, len(keys))
	for i, k := range keys {
		ks[i] = k
	}
	return map[string]any{"billable_metric_keys": ks}
}

// scopeGrant grants credits to customer id, scoped to keys (none: every
// metric), at priority prio; it returns the block's id.
func (a api) scopeGrant(id string, credits, prio int64, keys ...string) string {
	a.t.Helper()
	body := map[string]any{"credits": credits, "priority": prio}
	if len(keys) > 0 {
		body["applies_to"] = scoped(keys...)
	}
	g := a.grant(id, body)
	b := obj(a.t, g["block"], "grant block")
	got := b["applies_to"]
	if len(keys) == 0 && got != nil {
		a.a(fmt.Sprintf("unscoped grant answers applies_to %v", got))
	}
	if len(keys) > 0 {
		ks := arr(a.t, obj(a.t, got, "applies_to")["billable_metric_keys"], "billable_metric_keys")
		if len(ks) != len(keys) {
			a.a(fmt.Sprintf("grant answers applies_to %v, want %v", got, keys))
		}
	}
	return b["id"].(string)
}

// scopeKey is the scopeLeft key of a scope of keys: sorted, joined by ",".
func scopeKey(keys ...string) string {
	keys = slices.Clone(keys)
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// a reports a failure of an api helper.
func (a api) a(msg string) { a.t.Helper(); a.t.Errorf("%s", msg) }

// scopeLeft is the customer's live credit by scope text ("" unscoped,
// "k1,k2" otherwise), from its blocks.
func (a api) scopeLeft(id string) map[string]int64 {
	a.t.Helper()
	out := map[string]int64{}
	for _, x := range arr(a.t, a.credits(id)["blocks"], "blocks") {
		b := obj(a.t, x, "block")
		k := ""
		if s, ok := b["applies_to"].(map[string]any); ok {
			var keys []string
			for _, v := range arr(a.t, s["billable_metric_keys"], "keys") {
				keys = append(keys, v.(string))
			}
			k = strings.Join(keys, ",")
		}
		out[k] += Int(a.t, b["remaining_amount"])
	}
	return out
}

// wantLeft asserts the customer's credit by scope.
func (a api) wantLeft(id string, want map[string]int64, what string) {
	a.t.Helper()
	got := a.scopeLeft(id)
	for k, v := range want {
		if got[k] != v {
			a.t.Errorf("%s: credit by scope %v, want %v", what, got, want)
			return
		}
	}
}

// TestScopedCredits (issue 28 item 1): a grant scoped to metrics pays only
// for them. A consume of metric M drains, in spend order, the blocks
// scoped to M and the unscoped ones and nothing else; checks, snapshots and
// dry runs answer what M may spend; the credits endpoint breaks the credit
// down by scope; a reservation keeps what backs it against other metrics'
// charges; topups, import rows and plan grants carry applies_to; bad
// scopes are 422s naming the field that grant nothing; reconcile agrees.
func TestScopedCredits(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("scope"))
	a := s.as(t, tn.Live)
	ma, mb, mc := a.perUnit(100), a.perUnit(100), a.perUnit(100)

	t.Run("bad scopes", func(t *testing.T) {
		id, _ := a.newCustomer()
		many := make([]string, 21)
		for i := range many {
			many[i] = fmt.Sprintf("k%d", i)
		}
		for _, bad := range []any{scoped(), scoped("no spaces"), scoped(many...), map[string]any{}} {
			r := a.post("/v1/customers/"+id+"/credits/grant", map[string]any{"credits": 10, "source": "promotional",
				"reason": "r", "applies_to": bad})
			checkProblem(t, r, 422, "validation-error", "applies_to.billable_metric_keys", fmt.Sprintf("grant with applies_to %v", bad))
		}
		r := a.post("/v1/customers/"+id+"/topups", map[string]any{"credits": 10, "applies_to": scoped()})
		checkProblem(t, r, 422, "validation-error", "applies_to.billable_metric_keys", "topup with no keys")
		r = a.post("/v1/customers/"+id+"/credits/grant", map[string]any{"credits": 10, "source": "promotional",
			"reason": "r", "applies_to": "api"})
		checkProblem(t, r, 422, "validation-error", "", "grant with applies_to a string")
		if b := a.balance(id); b != 0 {
			t.Errorf("refused grants left a balance of %d", b)
		}
	})

	id, _ := a.newCustomer()
	a.scopeGrant(id, 1000, 0, ma)
	a.scopeGrant(id, 500, 0, mb, ma+"-later") // an unknown metric key is accepted
	a.scopeGrant(id, 300, 1)

	t.Run("checks, snapshots and by_scope", func(t *testing.T) {
		for _, tc := range []struct {
			metric string
			units  int64
			avail  int64
			ok     bool
		}{{ma, 13, 1300, true}, {ma, 14, 1300, false}, {mb, 8, 800, true}, {mc, 3, 300, true}, {mc, 4, 300, false}} {
			chk := a.get("/v1/customers/" + id + "/entitlements/" + url.PathEscape(tc.metric) + fmt.Sprintf("?units=%d", tc.units))
			if checkStatus(t, chk, 200, "check") && (chk.Body["allowed"] != tc.ok || Int(t, chk.Body["available_mc"]) != tc.avail) {
				t.Errorf("check of %d units of %s: %s, want allowed %v available_mc %d", tc.units, tc.metric, chk.Raw, tc.ok, tc.avail)
			}
		}
		snap := a.snapshot("/v1/customers/"+id+"/entitlements", true)
		if checkStatus(t, snap, 200, "snapshot") {
			ents := obj(t, snap.Body["entitlements"], "entitlements")
			for m, want := range map[string]int64{ma: 13, mb: 8, mc: 3} {
				e := obj(t, ents[m], "entry "+m)
				if Int(t, e["available_mc"]) != want*100 || Int(t, e["affordable_units"]) != want {
					t.Errorf("snapshot entry %s: %v, want available_mc %d, affordable_units %d", m, e, want*100, want)
				}
			}
		}
		r := a.get("/v1/customers/" + id + "/credits?by_scope=true")
		if checkStatus(t, r, 200, "credits by_scope") {
			if len(arr(t, r.Body["blocks"], "blocks")) != 0 {
				t.Errorf("by_scope without include_blocks listed blocks: %s", r.Raw)
			}
			bs := arr(t, r.Body["by_scope"], "by_scope")
			if len(bs) != 3 || obj(t, bs[0], "scope")["applies_to"] != nil || Int(t, obj(t, bs[0], "scope")["balance"]) != 300 {
				t.Errorf("by_scope %v: want the unscoped 300 first, then two scopes", bs)
			}
			var sum int64
			for _, x := range bs {
				sum += Int(t, obj(t, x, "scope")["balance"])
			}
			if sum != 1800 || Int(t, r.Body["balance"]) != 1800 {
				t.Errorf("by_scope sums to %d, balance %v; want 1800", sum, r.Body["balance"])
			}
		}
		plain := a.get("/v1/customers/" + id + "/credits")
		if _, ok := plain.Body["by_scope"]; ok {
			t.Errorf("by_scope without asking: %s", plain.Raw)
		}
	})

	t.Run("consumes drain only what applies", func(t *testing.T) {
		dry := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": mc,
			"units": 4, "dry_run": true})
		checkProblem(t, dry, 409, "insufficient-credits", "", "dry run of 4 of c")
		r := a.consumeUnits(id, ma, 11)
		if checkStatus(t, r, 200, "consume 1100 of a") && Int(t, r.Body["charged"]) != 1100 {
			t.Errorf("consume: %s", r.Raw)
		}
		a.wantLeft(id, map[string]int64{ma: 0, scopeKey(mb, ma+"-later"): 500, "": 200}, "after 1100 of a")
		checkProblem(t, a.consumeUnits(id, mc, 3), 409, "insufficient-credits", "", "300 of c with 200 unscoped")
		wantStatus(t, a.consumeUnits(id, mc, 2), 200, "200 of c")
		checkProblem(t, a.consumeUnits(id, ma, 1), 409, "insufficient-credits", "", "a with only b's credit left")
		wantStatus(t, a.consumeUnits(id, mb, 5), 200, "500 of b")
		if b := a.balance(id); b != 0 {
			t.Errorf("balance %d, want 0", b)
		}
	})

	t.Run("a reservation keeps its backing", func(t *testing.T) {
		h, _ := a.newCustomer()
		a.scopeGrant(h, 1000, 0, ma)
		a.scopeGrant(h, 500, 0, mb)
		a.scopeGrant(h, 300, 1)
		over := a.post("/v1/reservations", map[string]any{"customer_id": h, "billable_metric_key": mb, "estimated_units": 9})
		checkProblem(t, over, 409, "insufficient-credits", "", "reservation of 900 of b with 800 for b")
		reservation := a.reserve(map[string]any{"customer_id": h, "billable_metric_key": mb, "estimated_units": 7})
		// b needs 200 of the unscoped 300: a may take 1000 + 100.
		checkProblem(t, a.consumeUnits(h, ma, 12), 409, "insufficient-credits", "", "a past the reservation's backing")
		chk := a.get("/v1/customers/" + h + "/entitlements/" + url.PathEscape(ma) + "?units=11")
		if checkStatus(t, chk, 200, "check a") && (chk.Body["allowed"] != true || Int(t, chk.Body["available_mc"]) != 1100) {
			t.Errorf("check of a beside the reservation: %s", chk.Raw)
		}
		wantStatus(t, a.consumeUnits(h, ma, 11), 200, "1100 of a")
		r := a.post("/v1/reservations/"+reservation["id"].(string)+"/commit", map[string]any{"actual_units": 7})
		if checkStatus(t, r, 200, "commit 700 of b") && Int(t, obj(t, r.Body["account"], "account")["balance"]) != 0 {
			t.Errorf("commit: %s", r.Raw)
		}
		a.wantLeft(h, map[string]int64{ma: 0, mb: 0, "": 0}, "after the commit")
	})

	t.Run("multi-metric consumes charge each item from its own", func(t *testing.T) {
		m, _ := a.newCustomer()
		a.scopeGrant(m, 300, 0, ma)
		a.scopeGrant(m, 300, 0, mb)
		a.scopeGrant(m, 100, 1)
		items := func(ua, ub int) []any {
			return []any{map[string]any{"billable_metric_key": ma, "units": ua}, map[string]any{"billable_metric_key": mb, "units": ub}}
		}
		checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": m, "items": items(4, 4)}), 409,
			"insufficient-credits", "", "400 + 400 with 300 + 300 + 100")
		a.wantLeft(m, map[string]int64{ma: 300, mb: 300, "": 100}, "after the refused multi consume")
		wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": m, "items": items(4, 3)}), 200,
			"400 + 300")
		a.wantLeft(m, map[string]int64{ma: 0, mb: 0, "": 0}, "after the multi consume")
	})

	t.Run("topups, import rows and plan grants carry applies_to", func(t *testing.T) {
		tp, _ := a.newCustomer()
		r := a.post("/v1/customers/"+tp+"/topups", map[string]any{"credits": 400, "applies_to": scoped(mb)})
		wantStatus(t, r, 201, "scoped topup")
		a.wantLeft(tp, map[string]int64{mb: 400}, "after the topup")
		if l := a.get("/v1/customers/" + tp + "/topups"); checkStatus(t, l, 200, "topups") {
			data := arr(t, l.Body["data"], "topups")
			if len(data) != 1 || obj(t, obj(t, data[0], "topup")["applies_to"], "applies_to")["billable_metric_keys"] == nil {
				t.Errorf("topups list %s: want the topup's applies_to", l.Raw)
			}
		}
		checkProblem(t, a.consumeUnits(tp, ma, 1), 409, "insufficient-credits", "", "a against b's topup")

		ext := uniq("imp")
		imp := a.post("/v1/import", map[string]any{"customers": []any{map[string]any{"external_id": ext,
			"credits": []any{map[string]any{"credits": 200, "applies_to": scoped(ma)}, map[string]any{"credits": 50}}}}})
		if checkStatus(t, imp, 200, "import") && jsonInt(imp.Body["created"]) != 1 {
			t.Errorf("import: %s", imp.Raw)
		}
		bad := a.post("/v1/import", map[string]any{"customers": []any{map[string]any{"external_id": uniq("imp"),
			"credits": []any{map[string]any{"credits": 1, "applies_to": scoped()}}}}})
		if checkStatus(t, bad, 200, "import of a bad scope") && !strings.Contains(string(bad.Raw), "credits[0].applies_to.billable_metric_keys") {
			t.Errorf("import error does not name the field: %s", bad.Raw)
		}
		c := a.get("/v1/customer-by-external-id/" + ext)
		if checkStatus(t, c, 200, "imported customer") {
			a.wantLeft(c.Body["id"].(string), map[string]int64{ma: 200, "": 50}, "imported")
		}

		plan := a.newPlan(map[string]any{"name": uniq("plan")})
		v := a.newVariant(plan["id"].(string), map[string]any{"billing_cycle": "monthly"})
		path := "/v1/plans/" + plan["id"].(string) + "/variants/" + v["id"].(string) + "/grants"
		g := a.post(path, map[string]any{"credits": 100, "grant_interval": "monthly", "grant_type": "recurring",
			"applies_to": scoped(mb, ma)})
		if checkStatus(t, g, 201, "scoped plan grant") {
			keys := arr(t, obj(t, g.Body["applies_to"], "applies_to")["billable_metric_keys"], "keys")
			want := []string{ma, mb}
			slices.Sort(want)
			if len(keys) != 2 || keys[0] != want[0] || keys[1] != want[1] {
				t.Errorf("plan grant applies_to %v, want sorted %v", keys, want)
			}
		}
		checkProblem(t, a.post(path, map[string]any{"credits": 100, "grant_interval": "monthly", "grant_type": "recurring",
			"applies_to": scoped("bad key")}), 422, "validation-error", "applies_to.billable_metric_keys", "plan grant bad scope")
		// A subscription's plan grant makes blocks of the grant's scope.
		v2 := str(t, a.newVariant(plan["id"].(string), map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid"})["id"],
			"variant id")
		a.newGrant(plan["id"].(string), v2, map[string]any{"credits": 700, "grant_interval": "billing_period",
			"grant_type": "recurring", "applies_to": scoped(ma)})
		sub, _ := a.newCustomer()
		wantStatus(t, a.post("/v1/subscriptions", map[string]any{"customer_id": sub, "plan_variant_id": v2}), 201, "subscribe")
		a.wantLeft(sub, map[string]int64{ma: 700}, "after subscribing")
		checkProblem(t, a.consumeUnits(sub, mb, 1), 409, "insufficient-credits", "", "b against the plan's credit for a")
		wantStatus(t, a.consumeUnits(sub, ma, 7), 200, "the plan's credit for a")
	})

	t.Run("reconcile finds the books balanced", func(t *testing.T) {
		wantReconciled(t, s, "at the end")
		var n int
		if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM credit_blocks WHERE customer_id = $1
			AND applies_to IS NOT NULL`, id).Scan(&n); err != nil || n != 2 {
			t.Errorf("credit_blocks with applies_to: %d %v, want 2", n, err)
		}
	})
}

// TestScopedCreditsRace: 50 racing consumes of 100, half of metric a and
// half of metric b, against 1,000 scoped to a, 1,000 scoped to b and 500
// for every metric succeed exactly 25 times (each metric ends refused only
// once all it may use is spent), never overdraw a scope, and every
// consumption draws only from blocks that apply to its metric.
func TestScopedCreditsRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("scoperace"))
	a := s.as(t, tn.Live)
	ma, mb := a.perUnit(100), a.perUnit(100)
	id, _ := a.newCustomer()
	blockA, blockB := a.scopeGrant(id, 1000, 0, ma), a.scopeGrant(id, 1000, 0, mb)
	shared := a.scopeGrant(id, 500, 1)
	const racers = 50
	ok, refused := raceTally(t, raceConsumes(s, tn.Live, racers, func(i int) map[string]any {
		return map[string]any{"customer_id": id, "billable_metric_key": []string{ma, mb}[i%2], "units": 1}
	}), nil)
	if ok != 25 || refused != racers-25 {
		t.Fatalf("%d succeeded, %d refused; want exactly 25 and %d", ok, refused, racers-25)
	}
	if b := a.balance(id); b != 0 {
		t.Errorf("balance %d after the race, want 0", b)
	}
	allowed := map[string]map[string]bool{ma: {blockA: true, shared: true}, mb: {blockB: true, shared: true}}
	var paid int64
	for _, x := range a.history(id, "?type=consumption&limit=100") {
		e := obj(t, x, "entry")
		metric, _ := e["billable_metric_key"].(string)
		blocks := map[string]int64{}
		if b, ok := e["credit_block_id"].(string); ok {
			blocks[b] = -Int(t, e["delta"])
		}
		if ds, ok := e["draws"].([]any); ok {
			for _, d := range ds {
				dm := obj(t, d, "draw")
				blocks[dm["credit_block_id"].(string)] += Int(t, dm["amount"])
			}
		}
		for b, amt := range blocks {
			if !allowed[metric][b] {
				t.Errorf("a consumption of %s drew %d from block %s, which does not apply to it", metric, amt, b)
			}
			paid += amt
		}
	}
	if paid != 2500 {
		t.Errorf("the consumptions drew %d, want 2500", paid)
	}
	wantReconciled(t, s, "after the race")
}

// TestScopedCreditsSurviveRebuild: a block's scope is part of the state a
// rebuild restores from Postgres (credit_blocks.applies_to): after FLUSHALL
// and `creditd rebuild` the blocks carry the same scopes and the next
// consumes drain exactly what they did before.
func TestScopedCreditsSurviveRebuild(t *testing.T) {
	t.Parallel()
	rb := newRebuildable(t, "sc", "scoperebuild")
	s, a := rb.s, rb.a
	ma, mb := a.perUnit(100), a.perUnit(100)
	id, _ := a.newCustomer()
	// Enough blocks for the account layout's summary fields (lua/prelude/layout.lua
	// LAYOUT_MIN_ITEMS), a scoped one among them.
	for range 8 {
		a.scopeGrant(id, 100, 1)
	}
	a.scopeGrant(id, 1000, 0, ma)
	wantStatus(t, a.consumeUnits(id, ma, 3), 200, "300 of a")
	before := a.scopeLeft(id)
	rb.flushAndRebuild(t)
	a.wantLeft(id, before, "after the rebuild")
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile after the rebuild: %+v", rep.First)
	}
	checkProblem(t, a.consumeUnits(id, mb, 9), 409, "insufficient-credits", "", "900 of b with 800 unscoped")
	wantStatus(t, a.consumeUnits(id, mb, 8), 200, "800 of b")
	wantStatus(t, a.consumeUnits(id, ma, 7), 200, "700 of a")
	a.wantLeft(id, map[string]int64{ma: 0, "": 0}, "all spent")
}

// TestScopedReservationsRace: reservations of metric b, which only the unscoped credit
// backs (three made first, ten more racing), race 40 consumes of metric a,
// which may also use it and spends it first: whatever the interleaving,
// every reservation that was granted commits in full afterwards
// (the consumes of a never took the unscoped credit a reservation counted on), and
// the books balance.
func TestScopedReservationsRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("scopeholds"))
	a := s.as(t, tn.Live)
	ma, mb := a.perUnit(100), a.perUnit(100)
	id, _ := a.newCustomer()
	// a's own credit spends first, then the unscoped, which a plain drain of
	// a would take. The order matters to the guard below: a charge takes
	// blocks in spend order and stops where one more unit would unback a
	// reservation, so with the unscoped credit first and every unit of it pinned
	// by reservations of b (five reservations won the race before any consume) no consume
	// of a passed at all and the race tested nothing.
	a.scopeGrant(id, 1000, 0, ma)
	a.scopeGrant(id, 500, 1)
	var mu sync.Mutex
	var reservations []string
	// Three reservations before the race: with a plain drain the consumes of a
	// would spend the unscoped credit they count on.
	for range 3 {
		reservations = append(reservations, a.reserve(map[string]any{"customer_id": id, "billable_metric_key": mb, "estimated_units": 1})["id"].(string))
	}
	var consumed atomic.Int64
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%5 == 0 {
				r := s.Do("POST", "/v1/reservations", tn.Live, fmt.Sprintf("shold-%s-%d", id, i),
					map[string]any{"customer_id": id, "billable_metric_key": mb, "estimated_units": 1})
				switch r.Status {
				case 201:
					mu.Lock()
					reservations = append(reservations, r.Body["id"].(string))
					mu.Unlock()
				case 409:
				default:
					t.Errorf("reserve %d: %d %s", i, r.Status, r.Raw)
				}
				return
			}
			r := s.Do("POST", "/v1/entitlements/consume", tn.Live, fmt.Sprintf("sholdc-%s-%d", id, i),
				map[string]any{"customer_id": id, "billable_metric_key": ma, "units": 1})
			switch r.Status {
			case 200:
				consumed.Add(100)
			case 409:
			default:
				t.Errorf("consume %d: %d %s", i, r.Status, r.Raw)
			}
		}()
	}
	wg.Wait()
	if consumed.Load() == 0 {
		t.Fatalf("%d reservations, %d consumed: the race exercised nothing", len(reservations), consumed.Load())
	}
	if got := consumed.Load() + int64(len(reservations))*100; got > 1500 {
		t.Fatalf("consumed %d and held %d: more than the 1500 there was", consumed.Load(), len(reservations)*100)
	}
	for _, h := range reservations {
		r := a.post("/v1/reservations/"+h+"/commit", map[string]any{"actual_units": 1})
		checkStatus(t, r, 200, "commit of a reservation of b after the race")
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 1500-consumed.Load()-int64(len(reservations))*100 || Int(t, c["reserved_balance"]) != 0 {
		t.Errorf("after the commits: %v", c)
	}
	wantReconciled(t, s, "after the race")
}
