package lua

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// TestFusedDoor: a consume run under a fused door (door_fused.lua) on a
// single Redis checks the tenant's stamps and the key's record first and
// runs nothing when either is not as the request saw it; takes the rate
// budget and runs nothing when it refuses; leaves the rerun mark after an
// answer, the in-progress claim after a refusal, and nothing after an
// error its caller runs again (NOSTATE); and spends the rate budget once
// however often the script is run (issue 26).
func TestFusedDoor(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	if _, single := rdb.(*redis.Client); !single {
		if NewStore(rdb, prefix).FusesDoors() {
			t.Fatal("a store on a Cluster claims to fuse doors")
		}
		t.Skip("a fused door needs a single Redis")
	}
	b := bundle{store: NewStore(rdb, prefix), rdb: rdb, real: true}
	ctx := context.Background()
	if !b.store.FusesDoors() {
		t.Fatal("a store on a single Redis 7 does not fuse doors")
	}
	cases := []struct {
		name string
		// before runs after the door is set up, before the consume.
		before      func(t *testing.T, d *engine.FusedDoor, c engine.CustomerKey)
		units       int64
		rate        bool
		noState     bool
		wantErr     error
		wantOutcome engine.FusedOutcome
		wantRecord  byte // 0: none
		wantBalance int64
		wantRate    bool
	}{
		{name: "answered", units: 3, wantOutcome: engine.FusedMarked, wantRecord: idemRerun, wantBalance: 70},
		{name: "answered with a rate take", units: 3, rate: true, wantOutcome: engine.FusedMarked, wantRecord: idemRerun, wantBalance: 70, wantRate: true},
		{name: "a stamp moved", units: 3, before: func(t *testing.T, d *engine.FusedDoor, _ engine.CustomerKey) {
			if _, err := b.store.StampBump(ctx, d.Tenant, engine.StampCatalog); err != nil {
				t.Fatal(err)
			}
		}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale, wantBalance: 100},
		{name: "the key recorded", units: 3, before: func(t *testing.T, d *engine.FusedDoor, _ engine.CustomerKey) {
			if _, claimed, err := b.store.Begin(ctx, d.Tenant, d.Key, "another request", time.Minute); err != nil || !claimed {
				t.Fatalf("claim: %v %v", claimed, err)
			}
		}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale, wantRecord: idemRunning, wantBalance: 100},
		{name: "the rate refused", units: 3, rate: true, before: func(t *testing.T, d *engine.FusedDoor, _ engine.CustomerKey) {
			if rd, err := b.store.TakeRate(ctx, d.Tenant, d.Rate.Key, 1, 1, 1, time.Time{}); err != nil || !rd.Allowed {
				t.Fatalf("spend the budget: %+v %v", rd, err)
			}
		}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedRateRefused, wantBalance: 100, wantRate: true},
		{name: "refused", units: 11, wantErr: engine.ErrInsufficientCredits, wantOutcome: engine.FusedClaimed, wantRecord: idemRunning, wantBalance: 100},
		{name: "no state", units: 3, noState: true, wantErr: engine.ErrStateMissing, wantOutcome: engine.FusedUnused},
		// The body refuses before its replay reads the record: the other
		// request's claim stays as it was.
		{name: "no state, the key recorded", units: 3, noState: true, before: func(t *testing.T, d *engine.FusedDoor, _ engine.CustomerKey) {
			if _, claimed, err := b.store.Begin(ctx, d.Tenant, d.Key, "another request", time.Minute); err != nil || !claimed {
				t.Fatalf("claim: %v %v", claimed, err)
			}
		}, wantErr: engine.ErrStateMissing, wantOutcome: engine.FusedUnused, wantRecord: idemRunning},
		{name: "refused, the key recorded", units: 11, before: func(t *testing.T, d *engine.FusedDoor, _ engine.CustomerKey) {
			if _, claimed, err := b.store.Begin(ctx, d.Tenant, d.Key, "another request", time.Minute); err != nil || !claimed {
				t.Fatalf("claim: %v %v", claimed, err)
			}
		}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale, wantRecord: idemRunning, wantBalance: 100},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var c engine.CustomerKey
			if tc.noState {
				c = newCustomer()
			} else {
				c, _ = b.funded(t)
			}
			stamp, err := b.store.StampBump(ctx, c.TenantID, engine.StampTenant)
			if err != nil {
				t.Fatal(err)
			}
			d := &engine.FusedDoor{Tenant: c.TenantID, Checked: true, Key: "key-" + uuid.NewString(), RequestHash: "hash-1",
				LockTTL: time.Minute, Window: time.Hour}
			d.Stamps[engine.StampTenant] = stamp
			if tc.rate {
				d.Rate = &engine.RateAsk{Key: uuid.New(), PerSecond: 1, Burst: 1, Requests: 1}
			}
			if tc.before != nil {
				tc.before(t, d, c)
			}
			cmd := consumeCmd(c, tc.units, perUnitTerms(10), engine.OveragePolicyBlock, t0)
			cmd.IdempotencyKey, cmd.RequestHash = d.Key, d.RequestHash
			_, err = b.store.Consume(engine.WithFusedDoor(ctx, d), cmd)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("consume: %v, want %v", err, tc.wantErr)
			}
			if d.Outcome() != tc.wantOutcome {
				t.Errorf("outcome %d, want %d", d.Outcome(), tc.wantOutcome)
			}
			rec, err := rdb.Get(ctx, b.store.idemRecordKey(c.TenantID, d.Key)).Result()
			switch {
			case tc.wantRecord == 0 && !errors.Is(err, redis.Nil):
				t.Errorf("record %q (%v), want none", rec, err)
			case tc.wantRecord != 0 && (err != nil || rec[0] != tc.wantRecord):
				t.Errorf("record %q (%v), want state %q", rec, err, tc.wantRecord)
			}
			if !tc.noState {
				if got := b.balance(t, c); got != tc.wantBalance {
					t.Errorf("balance %d, want %d", got, tc.wantBalance)
				}
			}
			if d.RateTaken != tc.wantRate || (tc.wantRate && d.Rate != nil) {
				t.Errorf("rate taken %v (ask left %v), want %v", d.RateTaken, d.Rate != nil, tc.wantRate)
			}
		})
	}

	t.Run("state loaded, run again: the rate taken once", func(t *testing.T) {
		c := newCustomer()
		d := &engine.FusedDoor{Tenant: c.TenantID, Key: "key-" + uuid.NewString(), RequestHash: "hash-1",
			LockTTL: time.Minute, Window: time.Hour, Rate: &engine.RateAsk{Key: uuid.New(), PerSecond: 1, Burst: 1, Requests: 1}}
		fctx := engine.WithFusedDoor(ctx, d)
		cmd := consumeCmd(c, 1, flatTerms(0), engine.OveragePolicyBlock, t0)
		cmd.IdempotencyKey, cmd.RequestHash = d.Key, d.RequestHash
		if _, err := b.store.Consume(fctx, cmd); !errors.Is(err, engine.ErrStateMissing) {
			t.Fatalf("first run: %v, want NOSTATE", err)
		}
		if !d.RateTaken || !d.RateAnswer.Allowed || !d.Open() {
			t.Fatalf("after NOSTATE: taken %v %+v open %v, want the take made and the door open", d.RateTaken, d.RateAnswer, d.Open())
		}
		b.known(t, c)
		// The budget of burst 1 is spent: a second take would refuse.
		if _, err := b.store.Consume(fctx, cmd); err != nil {
			t.Fatalf("second run: %v", err)
		}
		if d.Outcome() != engine.FusedMarked {
			t.Errorf("outcome %d, want marked", d.Outcome())
		}
	})
}

// balance is c's balance as Snapshot reads it.
func (b bundle) balance(t *testing.T, c engine.CustomerKey) int64 {
	t.Helper()
	a, err := b.store.Snapshot(context.Background(), c, t0)
	if err != nil {
		t.Fatal(err)
	}
	return a.Balance
}

// TestFusedDoorNotesReservations: a reservation under a fused door that asks for
// the reservation notice appends it to the tenant's change feed in its own script
// (one entry, the customer's), and a replay of it appends none.
func TestFusedDoorNotesReservations(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	if _, single := rdb.(*redis.Client); !single {
		t.Skip("a fused door needs a single Redis")
	}
	// sets counts the SETs the client sends itself (a script's own are
	// not among them).
	var sets setCounter
	rdb.AddHook(&sets)
	b := bundle{store: NewStore(rdb, prefix), rdb: rdb, real: true}
	ctx := context.Background()
	c, _ := b.funded(t)
	cmd := reserveCmd(c, 2, perUnitTerms(10), time.Hour, t0)
	cmd.IdempotencyKey, cmd.RequestHash = "hold-key", "hash-1"
	feed := b.store.changesKey(c.TenantID)
	for i, want := range []int64{1, 1} {
		d := &engine.FusedDoor{Tenant: c.TenantID, Key: "key-" + uuid.NewString(), RequestHash: "hash-1",
			LockTTL: time.Minute, Window: time.Hour, ReservationNote: &c}
		before := sets.n.Load()
		res, err := b.store.Reserve(engine.WithFusedDoor(ctx, d), cmd)
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		if res.Replayed != (i == 1) || d.Noted != (i == 0) {
			t.Errorf("reserve %d: replayed %v noted %v", i, res.Replayed, d.Noted)
		}
		if n := rdb.XLen(ctx, feed).Val(); n != want {
			t.Errorf("after reserve %d the feed holds %d entries, want %d", i, n, want)
		}
		// The index record: the door writes it with the reservation, in
		// the script's round trip; a replay's is written again after it,
		// as without a door.
		if n, want := sets.n.Load()-before, map[bool]int64{false: 0, true: 1}[res.Replayed]; n != want {
			t.Errorf("reserve %d (replayed %v) sent %d SETs of its own, want %d", i, res.Replayed, n, want)
		}
		key := b.store.reservationRecordKey(cmd.ReservationID)
		if v := rdb.Get(ctx, key).Val(); v != customerMember(c)+"|s"+cmd.Metric {
			t.Errorf("after reserve %d the index record is %q", i, v)
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Hour+reservationIndexSlack {
			t.Errorf("after reserve %d the index record's TTL is %v", i, ttl)
		}
	}
	e := rdb.XRange(ctx, feed, "-", "+").Val()
	if len(e) != 1 || e[0].Values["customer"] != c.CustomerID.String() || e[0].Values["kind"] != "h" {
		t.Errorf("feed %v, want one reservation notice of %s", e, c.CustomerID)
	}
	// Under a key another request holds, the reserve's replay reads the
	// record with its op key: the door is stale and nothing is written,
	// no reservation, no notice, no index record.
	held := reserveCmd(c, 2, perUnitTerms(10), time.Hour, t0)
	held.IdempotencyKey, held.RequestHash = "held-key", "hash-1"
	d := &engine.FusedDoor{Tenant: c.TenantID, Key: "key-" + uuid.NewString(), RequestHash: "hash-1",
		LockTTL: time.Minute, Window: time.Hour, ReservationNote: &c}
	if _, claimed, err := b.store.Begin(ctx, d.Tenant, d.Key, "another request", time.Minute); err != nil || !claimed {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	if _, err := b.store.Reserve(engine.WithFusedDoor(ctx, d), held); !errors.Is(err, engine.ErrFusedStale) || d.Outcome() != engine.FusedStale {
		t.Fatalf("reserve under a held key: %v (outcome %d), want stale", err, d.Outcome())
	}
	if n := rdb.XLen(ctx, feed).Val(); n != 1 {
		t.Errorf("after a stale reserve the feed holds %d entries, want 1", n)
	}
	if n := rdb.Exists(ctx, b.store.reservationRecordKey(held.ReservationID)).Val(); n != 0 {
		t.Error("a stale reserve wrote its index record")
	}
	if rec := rdb.Get(ctx, b.store.idemRecordKey(c.TenantID, d.Key)).Val(); rec == "" || rec[0] != idemRunning {
		t.Errorf("the other request's record is %q, want its claim", rec)
	}
	if got := b.snapshot(t, c, t0); got.ReservedBalance != 20 {
		t.Errorf("reserved %d after a stale reserve, want the first reservation's 20 alone", got.ReservedBalance)
	}
}

// setCounter is a go-redis hook counting the SET commands a client sends.
type setCounter struct{ n atomic.Int64 }

func (h *setCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *setCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "set" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *setCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "set" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// TestFusedDoorLayout: door_fused.lua reads what fusedArgs sends in every
// shape (its DOOR_SHAPE counts the door's keys and arguments at the ends),
// and its HMGET asks engine.StampFields in their order, the order of the
// stamps' values fusedArgs sends.
func TestFusedDoorLayout(t *testing.T) {
	m := regexp.MustCompile(`redis\.call\('HMGET', stamps_key, ((?:'\w+'(?:, )?)+)\)`).FindStringSubmatch(doorFusedLua)
	if m == nil {
		t.Fatal("no HMGET of the stamps in door_fused.lua")
	}
	if want := "'" + strings.Join(engine.StampFields(), "', '") + "'"; m[1] != want {
		t.Errorf("door_fused.lua asks %s, want engine.StampFields %s", m[1], want)
	}
	shapes := map[string][2]int{}
	for _, e := range regexp.MustCompile(`\['(\d+)'\] = \{(?:true|false), (?:true|false), (?:true|false), (?:true|false), (\d+), (\d+)\}`).FindAllStringSubmatch(doorFusedLua, -1) {
		na, _ := strconv.Atoi(e[2])
		nk, _ := strconv.Atoi(e[3])
		shapes[e[1]] = [2]int{na, nk}
	}
	s := NewStore(nil, "layout")
	keys, args := []string{"k1", "k2", "k3"}, []any{"a1", "a2"}
	for shape := range len(doorShapeArgs) {
		d := &engine.FusedDoor{Tenant: uuid.New(), Checked: shape&1 != 0, Key: "key", RequestHash: "hash",
			LockTTL: time.Minute, Window: time.Hour}
		if shape&2 != 0 {
			d.Rate = &engine.RateAsk{Key: uuid.New(), PerSecond: 1, Burst: 1, Requests: 1}
		}
		if shape&4 != 0 {
			c := newCustomer()
			d.ReservationNote = &c
		}
		var ix *reservationIndex
		if shape&8 != 0 {
			ix = &reservationIndex{key: "index", record: "record", ttlMS: 60_000}
		}
		k, a, err := s.fusedArgs("fn", d, ix, keys, args)
		if err != nil {
			t.Fatal(err)
		}
		got := a[len(a)-1]
		want, ok := shapes[fmt.Sprint(got)]
		if !ok || got != doorShapeArgs[shape] {
			t.Fatalf("shape %d sent as %v, which DOOR_SHAPE lacks", shape, got)
		}
		if na, nk := len(a)-3-len(k)-len(args), len(k)-len(keys); na != want[0] || nk != want[1] {
			t.Errorf("shape %d: the door sends %d arguments and %d keys, DOOR_SHAPE reads %d and %d", shape, na, nk, want[0], want[1])
		}
		if d.Checked {
			d.Stamps = engine.TenantStamps{1, 0, 18446744073709551615, 4, 1764547200000000, 6}
			_, a, _ = s.fusedArgs("fn", d, ix, keys, args)
			if got, want := a[len(a)-shapes[fmt.Sprint(got)][0]+4], "1 0 18446744073709551615 4 1764547200000000 6"; got != want {
				t.Errorf("shape %d: the stamps sent as %q, want %q", shape, got, want)
			}
		}
		if !slices.Equal(k[:len(keys)], keys) || !reflect.DeepEqual(a[3+len(k):3+len(k)+len(args)], args) {
			t.Errorf("shape %d: the body's keys and arguments do not come first: %v %v", shape, k, a)
		}
		// The index record's key is the door's last, its value and TTL
		// the arguments before the shape.
		if ix != nil && (k[len(k)-1] != "index" || a[len(a)-3] != "record" || a[len(a)-2] != int64(60_000)) {
			t.Errorf("shape %d: the index record sent as %v %v", shape, k[len(k)-1], a[len(a)-3:len(a)-1])
		}
	}
}
