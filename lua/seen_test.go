package lua

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// recordingApplied answers from the Mutations it holds, as Postgres's
// operations table, and counts the look-ups.
type recordingApplied struct {
	fakeApplied
	n int
}

func (r *recordingApplied) AppliedOps(ctx context.Context, refs []engine.OpRef) ([]engine.Mutation, []bool, error) {
	r.n += len(refs)
	return r.fakeApplied.AppliedOps(ctx, refs)
}

// seedAll marks every partition of b's store seeded, with no keys.
func (b bundle) seedAll(t *testing.T, from time.Time) {
	t.Helper()
	parts := make([]int, Partitions)
	for p := range parts {
		parts[p] = p
	}
	if err := b.store.SeedSeen(context.Background(), nil, parts, from, true); err != nil {
		t.Fatal(err)
	}
}

// TestSeenFilterSparesPostgres (issue 26, invariant 16): once a
// partition's seen filter is seeded, a money call with a fresh
// idempotency key runs without asking Postgres; a retry whose op key the
// persister recorded and let go asks Postgres and replays, so it is never
// applied twice (invariant 4); a partition not seeded (first start, lost
// Redis data) asks Postgres for every key whose op key is absent.
func TestSeenFilterSparesPostgres(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, grantCmd(c, 1000, t0))
		pg := &recordingApplied{}
		b.store.WithAppliedOps(pg).WithClock(&testClock{now: t0})
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 10}
		consume := func(key string, now time.Time) (engine.MutationResult, error) {
			cmd := consumeCmd(c, 2, terms, engine.OveragePolicyBlock, now)
			cmd.IdempotencyKey, cmd.RequestHash = key, "rh-"+key
			return b.store.Consume(ctx, cmd)
		}

		// Not seeded: an absent op key asks Postgres.
		if _, err := consume("before-seed", t0); err != nil {
			t.Fatal(err)
		}
		if pg.n != 1 {
			t.Fatalf("unseeded partition: %d look-ups, want 1", pg.n)
		}

		b.seedAll(t, t0)
		first, err := consume("fresh", t0)
		if err != nil || first.Replayed {
			t.Fatalf("fresh key: %v replayed=%v", err, first.Replayed)
		}
		if pg.n != 1 {
			t.Errorf("fresh key in a seeded partition: %d look-ups, want still 1", pg.n)
		}
		// A retry while the op key stands replays from Redis.
		if res, err := consume("fresh", t0); err != nil || !res.Replayed {
			t.Fatalf("retry under the op key: %v replayed=%v", err, res.Replayed)
		}
		if pg.n != 1 {
			t.Errorf("retry under the op key: %d look-ups, want still 1", pg.n)
		}

		// The persister commits it, records it and shortens the op key; the
		// grace runs out. A retry 25 h later asks Postgres and replays.
		if err := b.store.ForgetOps(ctx, Partition(c.CustomerID), []engine.Mutation{first.Mutation}); err != nil {
			t.Fatal(err)
		}
		if ttl := b.rdb.PTTL(ctx, b.store.opKeyOf(c.CustomerID, "fresh")).Val(); ttl <= 0 || ttl > idempotency.OpKeyGrace {
			t.Errorf("op key TTL after ForgetOps %s, want within the grace", ttl)
		}
		b.rdb.Del(ctx, b.store.opKeyOf(c.CustomerID, "fresh"))
		pg.fakeApplied = fakeApplied{first.Mutation}
		version := b.snapshot(t, c, t0).Version
		for _, later := range []time.Duration{25 * time.Hour, idempotency.SeenHorizon} {
			res, err := consume("fresh", t0.Add(later))
			if err != nil || !res.Replayed || res.Mutation.OpID != first.Mutation.OpID {
				t.Errorf("retry %s later: %v replayed=%v op %s, want a replay of %s", later, err, res.Replayed, res.Mutation.OpID, first.Mutation.OpID)
			}
		}
		if v := b.snapshot(t, c, t0).Version; v != version {
			t.Errorf("retries moved the account to version %d from %d", v, version)
		}
		if pg.n != 3 {
			t.Errorf("%d look-ups after two late retries, want 3", pg.n)
		}

		// A lost seeded mark (Redis lost its data) sends absent keys to
		// Postgres again.
		b.rdb.Del(ctx, b.store.seenMark(Partition(c.CustomerID)))
		if _, err := consume("after-loss", t0); err != nil {
			t.Fatal(err)
		}
		if pg.n != 4 {
			t.Errorf("after the mark was lost: %d look-ups, want 4", pg.n)
		}
	})
}

// seenMaybeScript asks the prelude's seen_maybe about op key ARGV[1] with
// the filter keys KEYS (the seeded mark's value read as replay reads it).
var seenMaybeScript = withPrelude("if seen_maybe(seen_keys(KEYS, 1), ARGV[1], redis.call('MGET', KEYS[1])[1]) then return 1 end return 0")

// TestSeenFilterNoFalseNew: every key recorded (by the persister or the
// seeding, in any of the periods a call consults) reads "maybe", never
// "certainly new", so no recorded key can run twice; keys never recorded
// read "new" all but rarely (the false positives cost a Postgres look-up).
func TestSeenFilterNoFalseNew(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		const n = 3000
		c := uuid.New()
		p := Partition(c)
		var refs []engine.OpRef
		for i := range n {
			refs = append(refs, engine.OpRef{Customer: engine.CustomerKey{CustomerID: c}, Key: fmt.Sprintf("k-%d", i)})
		}
		clock := &testClock{now: t0}
		b.store.WithClock(clock)
		// Half recorded a period before the call, half in its period.
		clock.now = t0.Add(-idempotency.SeenPeriod)
		if err := b.store.SeedSeen(ctx, refs[:n/2], []int{p}, clock.now, true); err != nil {
			t.Fatal(err)
		}
		clock.now = t0
		if err := b.store.SeedSeen(ctx, refs[n/2:], nil, t0, false); err != nil {
			t.Fatal(err)
		}
		keys := b.store.seenKeys(p, t0)
		for _, r := range refs {
			v, err := seenMaybeScript.Run(ctx, b.rdb, keys, b.store.opKeyOf(c, r.Key)).Int()
			if err != nil {
				t.Fatal(err)
			}
			if v != 1 {
				t.Fatalf("recorded key %s reads certainly new", r.Key)
			}
		}
		maybe := 0
		for i := range n {
			v, err := seenMaybeScript.Run(ctx, b.rdb, keys, b.store.opKeyOf(c, fmt.Sprintf("other-%d", i))).Int()
			if err != nil {
				t.Fatal(err)
			}
			maybe += v
		}
		if maybe > n/1000 {
			t.Errorf("%d of %d keys never recorded read maybe, want at most 0.1%%", maybe, n)
		}
		// Past the horizon the older period is no longer consulted.
		late := b.store.seenKeys(p, t0.Add(idempotency.SeenPeriod))
		if v, _ := seenMaybeScript.Run(ctx, b.rdb, late, b.store.opKeyOf(c, refs[0].Key)).Int(); v != 0 {
			t.Errorf("a key recorded %s before the call still reads maybe", 2*idempotency.SeenPeriod)
		}
	})
}

type testClock struct{ now time.Time }

func (c *testClock) Now() time.Time { return c.now }

// TestSeenFilterTiers: a period's first keys go to the 16 buckets of tier
// 1, the next to the 64 of tier 2, and so on to the 1,048,576 of tier 7,
// and a key recorded in any tier reads "maybe" (the tier counts are set at
// their caps here so each tier fills in a few keys).
func TestSeenFilterTiers(t *testing.T) {
	t.Parallel()
	caps := []int{1024, 4096, 16384, 65536, 262144, 4194304}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		for tier := 1; tier <= 7; tier++ {
			t.Run(fmt.Sprintf("tier %d", tier), func(t *testing.T) {
				c := uuid.New()
				p := Partition(c)
				b.store.WithClock(&testClock{now: t0})
				wk := b.store.seenHash(p, seenPeriod(t0))
				// Another case's customer may share the partition.
				if err := b.rdb.Del(ctx, wk).Err(); err != nil {
					t.Fatal(err)
				}
				counts := map[string]int{}
				for i := 1; i < tier; i++ {
					counts[fmt.Sprintf("#%d", i)] = caps[i-1]
				}
				for f, n := range counts {
					if err := b.rdb.HSet(ctx, wk, f, n).Err(); err != nil {
						t.Fatal(err)
					}
				}
				var refs []engine.OpRef
				for i := range 40 {
					refs = append(refs, engine.OpRef{Customer: engine.CustomerKey{CustomerID: c}, Key: fmt.Sprintf("t%d-%d", tier, i)})
				}
				// Twice: recording a key again adds nothing.
				for range 2 {
					if err := b.store.SeedSeen(ctx, refs, []int{p}, t0, true); err != nil {
						t.Fatal(err)
					}
				}
				fields, err := b.rdb.HGetAll(ctx, wk).Result()
				if err != nil {
					t.Fatal(err)
				}
				held := 0
				for f, v := range fields {
					if f[0] == '#' {
						continue
					}
					// Tier 5's fields are 3 hex digits; the others open
					// with their letter.
					inTier := 5
					if i := strings.IndexByte("wxyzXvu", f[0]); i >= 0 && i != 4 {
						inTier = i + 1
					}
					if wantLen := map[int]int{5: 3, 6: 5, 7: 6}[inTier]; wantLen > 0 && len(f) != wantLen {
						t.Errorf("tier %d bucket %q, want %d characters", inTier, f, wantLen)
					}
					if inTier != tier {
						t.Errorf("bucket %q (tier %d) in a period whose keys belong in tier %d", f, inTier, tier)
					}
					held += len(v) / 4
				}
				if held != len(refs) {
					t.Errorf("%d fingerprints held, want %d", held, len(refs))
				}
				if tier < 7 {
					counts[fmt.Sprintf("#%d", tier)] += len(refs)
				}
				for f, want := range counts {
					if got, _ := strconv.Atoi(fields[f]); got != want {
						t.Errorf("count %s = %d, want %d", f, got, want)
					}
				}
				keys := b.store.seenKeys(p, t0)
				for _, r := range refs {
					if v, err := seenMaybeScript.Run(ctx, b.rdb, keys, b.store.opKeyOf(c, r.Key)).Int(); err != nil || v != 1 {
						t.Fatalf("recorded key %s reads %d (%v), want maybe", r.Key, v, err)
					}
				}
			})
		}
	})
}
