package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/lua"
)

// poolFamily creates a parent granted parentCredits and a child of it
// granted childCredits, with a draw limit (nil: none); it returns both ids.
func (a api) poolFamily(parentCredits, childCredits int64, limit map[string]any) (parent, child string) {
	a.t.Helper()
	parent = a.createCustomer(map[string]any{"external_id": uniq("org")})["id"].(string)
	if parentCredits > 0 {
		a.grant(parent, map[string]any{"credits": parentCredits})
	}
	body := map[string]any{"external_id": uniq("member"), "parent_id": parent}
	if limit != nil {
		body["parent_draw_limit"] = limit
	}
	c := a.createCustomer(body)
	if c["parent_id"] != parent {
		a.t.Fatalf("created child: %v, want parent_id %s", c, parent)
	}
	child = c["id"].(string)
	if childCredits > 0 {
		a.grant(child, map[string]any{"credits": childCredits})
	}
	return parent, child
}

// balanceOf is the customer's balance in the credits answer.
func (a api) balanceOf(id string) int64 {
	a.t.Helper()
	return Int(a.t, a.credits(id)["balance"])
}

// TestSharedPool (issue 28 item 4): a child spends its own credit, then its
// parent's within its draw limit per period; the parent's part is a
// pool_draw entry in the parent's ledger naming the child; a check counts
// the pool; the one-level rules and the slot rule refuse with the field
// named; removing the parent stops the draws.
func TestSharedPool(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("pool"))
	a := s.as(t, tn.Live)
	m := a.perUnit(1)

	parent, child := a.poolFamily(1000, 100, map[string]any{"period": "day", "limit_mc": 300})

	t.Run("bad parents", func(t *testing.T) {
		cases := []struct {
			body  map[string]any
			field string
		}{
			{map[string]any{"parent_id": uuid.NewString()}, "parent_id"},
			{map[string]any{"parent_id": child}, "parent_id"}, // a child cannot be a parent
			{map[string]any{"parent_draw_limit": map[string]any{"period": "day", "limit_mc": 1}}, "parent_draw_limit"},
			{map[string]any{"parent_id": parent, "parent_draw_limit": map[string]any{"period": "week", "limit_mc": 1}}, "parent_draw_limit.period"},
			{map[string]any{"parent_id": parent, "parent_draw_limit": map[string]any{"period": "day", "limit_mc": -1}}, "parent_draw_limit.limit_mc"},
		}
		for _, c := range cases {
			c.body["external_id"] = uniq("bad")
			checkProblem(t, a.post("/v1/customers", c.body), 422, "validation-error", c.field, fmt.Sprintf("create with %v", c.body))
		}
		// A parent cannot become a child.
		other := a.createCustomer(map[string]any{"external_id": uniq("other")})["id"].(string)
		checkProblem(t, a.patch("/v1/customers/"+parent, map[string]any{"parent_id": other}), 422, "validation-error",
			"parent_id", "a parent given a parent")
		// An existing customer of another slot cannot join (its id names
		// its state): 409, and nothing changes.
		for lua.Partition(uuid.MustParse(other)) == lua.Partition(uuid.MustParse(parent)) {
			other = a.createCustomer(map[string]any{"external_id": uniq("other")})["id"].(string)
		}
		checkProblem(t, a.patch("/v1/customers/"+other, map[string]any{"parent_id": parent}), 409, "conflict",
			"parent_id", "joining a parent of another slot")
		if c := a.get("/v1/customers/" + other); c.Body["parent_id"] != nil {
			t.Errorf("a refused patch set the parent: %s", c.Raw)
		}
	})

	t.Run("own credit first, then the parent's within the limit", func(t *testing.T) {
		r := a.consumeUnits(child, m, 250)
		if checkStatus(t, r, 200, "250 of 100 own") && (Int(t, r.Body["charged"]) != 250 || Int(t, r.Body["pool_mc"]) != 150) {
			t.Errorf("consume: %s, want charged 250 and pool_mc 150", r.Raw)
		}
		if c, p := a.balanceOf(child), a.balanceOf(parent); c != 0 || p != 850 {
			t.Errorf("balances child %d parent %d, want 0 and 850", c, p)
		}
		// A check counts what the limit leaves of the pool: 150.
		chk := a.get(fmt.Sprintf("/v1/customers/%s/entitlements/%s?units=151", child, url.PathEscape(m)))
		if checkStatus(t, chk, 200, "check") && (chk.Body["allowed"] != false || Int(t, chk.Body["pool_available_mc"]) != 150) {
			t.Errorf("check of 151: %s, want not allowed and pool_available_mc 150", chk.Raw)
		}
		// So does a snapshot's metered entry, which the edge evaluators read.
		snap := a.snapshot("/v1/customers/"+child+"/entitlements", true)
		if e := obj(t, obj(t, snap.Body["entitlements"], "entitlements")[m], "entry"); Int(t, e["available_mc"]) != 150 {
			t.Errorf("snapshot entry %v, want available_mc 150 (the pool the limit leaves)", e)
		}
		checkProblem(t, a.consumeUnits(child, m, 151), 409, "insufficient-credits", "", "past the draw limit")
		wantStatus(t, a.consumeUnits(child, m, 150), 200, "to the draw limit")
		cr := a.credits(child)
		if d, ok := cr["parent_draw_limit"].(map[string]any); !ok || Int(t, d["drawn_mc"]) != 300 || cr["parent_id"] != parent {
			t.Errorf("child credits: %v, want parent_id and parent_draw_limit.drawn_mc 300", cr)
		}
		if p := a.balanceOf(parent); p != 700 {
			t.Errorf("parent balance %d, want 700", p)
		}
		// The parent's ledger names the child on each draw.
		s.Drain()
		var drawn int64
		for _, e := range a.history(parent, "?limit=100") {
			eo := obj(t, e, "entry")
			if eo["type"] != "pool_draw" {
				continue
			}
			if eo["reference_id"] != child || eo["billable_metric_key"] != m {
				t.Errorf("pool_draw entry %v, want reference_id %s and the metric", eo, child)
			}
			drawn -= Int(t, eo["delta"])
		}
		if drawn != 300 {
			t.Errorf("pool_draw entries sum to %d, want 300", drawn)
		}
	})

	t.Run("removing the parent stops the draws", func(t *testing.T) {
		_, kid := a.poolFamily(0, 0, nil)
		r := a.patch("/v1/customers/"+kid, map[string]any{"parent_id": nil})
		if checkStatus(t, r, 200, "remove the parent") && (r.Body["parent_id"] != nil || r.Body["parent_draw_limit"] != nil) {
			t.Errorf("patched: %s, want no parent", r.Raw)
		}
		checkProblem(t, a.consumeUnits(kid, m, 1), 409, "insufficient-credits", "", "no parent any more")
		// A deleted parent lends nothing either.
		org, member := a.poolFamily(100, 0, nil)
		wantStatus(t, a.do("DELETE", "/v1/customers/"+org, "", nil), 204, "delete the parent")
		checkProblem(t, a.consumeUnits(member, m, 1), 409, "insufficient-credits", "", "the parent deleted")
	})
	wantReconciled(t, s, "at the end")
}

// TestSharedPoolRace: 50 racing consumes of 100 by children of one parent
// never pass the pool (1,500) nor a child's draw limit.
func TestSharedPoolRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("poolrace"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)
	parent, first := a.poolFamily(1500, 0, nil)
	// A second child may draw 500 a day at most.
	second := a.createCustomer(map[string]any{"external_id": uniq("member"), "parent_id": parent,
		"parent_draw_limit": map[string]any{"period": "day", "limit_mc": 500}})["id"].(string)

	const racers = 50
	var ok, refused, okSecond int
	for i, r := range raceConsumes(s, tn.Live, racers, func(i int) map[string]any {
		return map[string]any{"customer_id": []string{first, second}[i%2], "billable_metric_key": m, "units": 1}
	}) {
		switch r.Status {
		case 200:
			ok++
			if i%2 == 1 {
				okSecond++
			}
		case 409:
			refused++
		default:
			t.Errorf("racer %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if ok != 15 || refused != racers-15 || okSecond > 5 {
		t.Fatalf("%d succeeded (%d by the limited child), %d refused; want exactly 15, at most 5 and %d",
			ok, okSecond, refused, racers-15)
	}
	if p := a.balanceOf(parent); p != 0 {
		t.Errorf("parent balance after the race %d, want 0", p)
	}
	wantReconciled(t, s, "after the race")
}

// TestSharedPoolSurvivesRebuild: after FLUSHALL and `creditd rebuild` the
// parent's balance and the child's draw counter (summed from the parent's
// pool_draw entries) are what they were, so the limit still refuses at the
// same draw; a parent whose hash is gone is loaded by the charge.
func TestSharedPoolSurvivesRebuild(t *testing.T) {
	t.Parallel()
	rb := newRebuildable(t, "po", "poolrebuild")
	s, a, rdb := rb.s, rb.a, rb.rdb
	m := a.perUnit(1)
	parent, child := a.poolFamily(1000, 50, map[string]any{"period": "month", "time_zone": "Europe/Berlin", "limit_mc": 200})
	wantStatus(t, a.consumeUnits(child, m, 170), 200, "50 own, 120 pooled")
	rb.flushAndRebuild(t)
	if d, ok := a.credits(child)["parent_draw_limit"].(map[string]any); !ok || Int(t, d["drawn_mc"]) != 120 {
		t.Errorf("rebuilt draw counter: %v, want drawn_mc 120", d)
	}
	if p := a.balanceOf(parent); p != 880 {
		t.Errorf("rebuilt parent balance %d, want 880", p)
	}
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile after the rebuild: %+v", rep.First)
	}
	// A parent Redis has lost is loaded by the child's charge that needs it.
	if err := rdb.Del(context.Background(), accountKeyOf(s, parent)).Err(); err != nil {
		t.Fatal(err)
	}
	checkProblem(t, a.consumeUnits(child, m, 81), 409, "insufficient-credits", "", "past the limit after the rebuild")
	wantStatus(t, a.consumeUnits(child, m, 80), 200, "to the limit after the rebuild")
}

// TestPoolChainRace: two PATCHes that each join one level, A under B and
// B under C, race (each passes the engine's checks, read before either
// writes); the directory's row locks let at most one through, so no pool
// is ever two levels deep (persist/directory.go withPoolLock).
func TestPoolChainRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("poolchain"))
	a := s.as(t, tn.Live)
	root := a.createCustomer(map[string]any{"external_id": uniq("org")})["id"].(string)
	// A member is minted in its parent's slot: created under the root and
	// set free, B and A share the root's slot, as a PATCH joining needs.
	free := func() string {
		id := a.createCustomer(map[string]any{"external_id": uniq("member"), "parent_id": root})["id"].(string)
		checkStatus(t, a.patch("/v1/customers/"+id, map[string]any{"parent_id": nil}), 200, "set free")
		return id
	}
	b, x := free(), free()
	for round := 0; round < 12; round++ {
		var under, over Response
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); under = a.patch("/v1/customers/"+x, map[string]any{"parent_id": b}) }()
		go func() { defer wg.Done(); over = a.patch("/v1/customers/"+b, map[string]any{"parent_id": root}) }()
		wg.Wait()
		for _, r := range []Response{under, over} {
			if r.Status != 200 {
				checkProblem(t, r, 422, "validation-error", "parent_id", fmt.Sprintf("round %d: the refused join", round))
			}
		}
		if under.Status == 200 && over.Status == 200 {
			t.Fatalf("round %d: both joins succeeded: %s under %s under %s, two levels deep", round, x, b, root)
		}
		if under.Status != 200 && over.Status != 200 {
			t.Errorf("round %d: both joins refused (%s; %s)", round, under.Raw, over.Raw)
		}
		for _, id := range []string{x, b} {
			checkStatus(t, a.patch("/v1/customers/"+id, map[string]any{"parent_id": nil}), 200, "reset")
		}
	}
}

// TestSharedPoolDryRun: a dry run of a child's charge that its parent
// shares lists the child's blocks and then the parent's, each with what it
// would pay, and pool_mc the parent's part; nothing changes.
func TestSharedPoolDryRun(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("pooldry"))
	a := s.as(t, tn.Live)
	m := a.perUnit(1)
	parent := a.createCustomer(map[string]any{"external_id": uniq("org")})["id"].(string)
	parentBlock := obj(t, a.grant(parent, map[string]any{"credits": 1000})["block"], "parent's block")["id"]
	child := a.createCustomer(map[string]any{"external_id": uniq("member"), "parent_id": parent})["id"].(string)
	childBlock := obj(t, a.grant(child, map[string]any{"credits": 100})["block"], "child's block")["id"]

	r := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": child, "billable_metric_key": m, "units": 300, "dry_run": true})
	if !checkStatus(t, r, 200, "pooled dry run") {
		return
	}
	if r.Body["dry_run"] != true || Int(t, r.Body["charged"]) != 300 || Int(t, r.Body["pool_mc"]) != 200 {
		t.Errorf("pooled dry run answer: %s", r.Raw)
	}
	draws := arr(t, r.Body["draws"], "draws")
	if len(draws) != 2 {
		t.Fatalf("draws %v, want the child's block then the parent's", draws)
	}
	for i, want := range []struct {
		block  any
		amount int64
	}{{childBlock, 100}, {parentBlock, 200}} {
		d := obj(t, draws[i], "draw")
		if d["credit_block_id"] != want.block || Int(t, d["amount"]) != want.amount {
			t.Errorf("draw %d: %v, want %d from block %v", i, d, want.amount, want.block)
		}
	}
	if b, p := a.balanceOf(child), a.balanceOf(parent); b != 100 || p != 1000 {
		t.Errorf("after a dry run: child %d, parent %d; want 100 and 1000", b, p)
	}
}

// TestSharedPoolMulti: a multi-metric consume of a child draws on its
// parent as a single one does (docs/rules.md "Shared pools"): its own
// credit first, then the parent's within the draw limit, pool_mc in the
// answer, the parent's pool_draw entry naming the child (and no metric,
// as the child's entry names none); a charge the limit leaves short is
// refused whole; a dry run answers pool_mc and the parent's blocks after
// the child's; Postgres agrees with Redis at the end.
func TestSharedPoolMulti(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("poolmulti"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(1), a.perUnit(2)

	parent, child := a.poolFamily(1000, 100, map[string]any{"period": "day", "limit_mc": 300})
	consume := func(items []any, dry bool) Response {
		body := map[string]any{"customer_id": child, "items": items}
		if dry {
			body["dry_run"] = true
		}
		return a.post("/v1/entitlements/consume", body)
	}

	// 50 + 2*100 = 250: 100 the child's, 150 the parent's.
	dry := consume(items(m1, 50, m2, 100), true)
	if checkStatus(t, dry, 200, "pooled multi dry run") {
		if dry.Body["dry_run"] != true || Int(t, dry.Body["charged"]) != 250 || Int(t, dry.Body["pool_mc"]) != 150 {
			t.Errorf("dry run: %s, want charged 250 and pool_mc 150", dry.Raw)
		}
		if d := arr(t, dry.Body["draws"], "draws"); len(d) != 2 || Int(t, obj(t, d[0], "draw")["amount"]) != 100 ||
			Int(t, obj(t, d[1], "draw")["amount"]) != 150 {
			t.Errorf("dry run draws %v, want the child's 100, then the parent's 150", d)
		}
	}
	if c, p := a.balanceOf(child), a.balanceOf(parent); c != 100 || p != 1000 {
		t.Errorf("after the dry run: child %d parent %d, want 100 and 1000", c, p)
	}

	key, body := idemKey(), map[string]any{"customer_id": child, "items": items(m1, 50, m2, 100)}
	r := a.do("POST", "/v1/entitlements/consume", key, body)
	if checkStatus(t, r, 200, "250 of 100 own") && (Int(t, r.Body["charged"]) != 250 || Int(t, r.Body["pool_mc"]) != 150) {
		t.Errorf("consume: %s, want charged 250 and pool_mc 150", r.Raw)
	}
	// A retry replays the answer, pool_mc included, and draws nothing more.
	if again := a.do("POST", "/v1/entitlements/consume", key, body); again.Status != 200 || !bytes.Equal(again.Raw, r.Raw) {
		t.Errorf("retry: %d %s, want %s", again.Status, again.Raw, r.Raw)
	}
	if c, p := a.balanceOf(child), a.balanceOf(parent); c != 0 || p != 850 {
		t.Errorf("balances child %d parent %d, want 0 and 850", c, p)
	}
	// The limit leaves 150: 151 is refused whole, 150 passes.
	checkProblem(t, consume(items(m1, 1, m2, 75), false), 409, "insufficient-credits", "", "past the draw limit")
	if p := a.balanceOf(parent); p != 850 {
		t.Errorf("a refused charge moved the parent: %d, want 850", p)
	}
	wantStatus(t, consume(items(m1, 50, m2, 50), false), 200, "to the draw limit")
	cr := a.credits(child)
	if d, ok := cr["parent_draw_limit"].(map[string]any); !ok || Int(t, d["drawn_mc"]) != 300 {
		t.Errorf("child credits: %v, want parent_draw_limit.drawn_mc 300", cr)
	}
	if p := a.balanceOf(parent); p != 700 {
		t.Errorf("parent balance %d, want 700", p)
	}

	s.Drain()
	var drawn int64
	for _, e := range a.history(parent, "?limit=100") {
		eo := obj(t, e, "entry")
		if eo["type"] != "pool_draw" {
			continue
		}
		if eo["reference_id"] != child || eo["billable_metric_key"] != nil {
			t.Errorf("pool_draw entry %v, want reference_id %s and no metric", eo, child)
		}
		drawn -= Int(t, eo["delta"])
	}
	if drawn != 300 {
		t.Errorf("pool_draw entries sum to %d, want 300", drawn)
	}
	wantReconciled(t, s, "at the end")
}

// TestSharedPoolMultiRace: 50 racing multi-metric consumes of 100 by
// children of one parent never pass the pool (1,500) nor a child's draw
// limit (500), and the ledger agrees once the persister drained.
func TestSharedPoolMultiRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("poolmultirace"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(30), a.perUnit(70)
	parent, first := a.poolFamily(1500, 0, nil)
	second := a.createCustomer(map[string]any{"external_id": uniq("member"), "parent_id": parent,
		"parent_draw_limit": map[string]any{"period": "day", "limit_mc": 500}})["id"].(string)

	const racers = 50
	var ok, refused, okSecond int
	for i, r := range raceConsumes(s, tn.Live, racers, func(i int) map[string]any {
		return map[string]any{"customer_id": []string{first, second}[i%2], "items": items(m1, 1, m2, 1)}
	}) {
		switch r.Status {
		case 200:
			ok++
			if i%2 == 1 {
				okSecond++
			}
			if Int(t, r.Body["pool_mc"]) != 100 {
				t.Errorf("racer %d: %s, want pool_mc 100", i, r.Raw)
			}
		case 409:
			refused++
		default:
			t.Errorf("racer %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if ok != 15 || refused != racers-15 || okSecond > 5 {
		t.Fatalf("%d succeeded (%d by the limited child), %d refused; want exactly 15, at most 5 and %d",
			ok, okSecond, refused, racers-15)
	}
	if p := a.balanceOf(parent); p != 0 {
		t.Errorf("parent balance after the race %d, want 0", p)
	}
	d, isMap := a.credits(second)["parent_draw_limit"].(map[string]any)
	if !isMap || Int(t, d["drawn_mc"]) != int64(okSecond)*100 {
		t.Errorf("limited child's draw limit %v, want drawn_mc %d", d, okSecond*100)
	}
	// Postgres agrees: the parent's pool_draw entries sum to the pool, and
	// reconcile finds no customer whose ledger differs from Redis.
	s.Drain()
	var drawn int64
	for _, e := range a.history(parent, "?limit=100") {
		if eo := obj(t, e, "entry"); eo["type"] == "pool_draw" {
			drawn -= Int(t, eo["delta"])
		}
	}
	if drawn != 1500 {
		t.Errorf("the parent's pool_draw entries sum to %d, want 1500", drawn)
	}
	wantReconciled(t, s, "after the race")
}
