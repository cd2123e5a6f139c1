package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// The seen filter tells a money call whose op key Redis no longer holds
// whether its idempotency key was certainly never applied, so it runs
// without asking Postgres (issue 26; prelude/seen.lua seen_put says how it is
// kept). Each partition has one hash per period (idempotency.SeenPeriod),
// filled by the persister as it commits (ForgetOps) and by the seeding from
// Postgres (SeedSeen); a money call consults the hashes of the current
// period and the idempotency.SeenPeriods-1 before it.

var (
	//go:embed seen_add.lua
	seenAddLua    string
	seenAddScript = newScript("seen_add", seenAddLua)

	//go:embed seen_seed.lua
	seenSeedLua    string
	seenSeedScript = newScript("seen_seed", seenSeedLua)
)

// errMaybeSeen is a money script's answer when its op key is absent and the
// seen filter may know the key (MAYBESEEN): the caller asks Postgres and
// runs the script again without the filter (appliedFirst).
var errMaybeSeen = errors.New("lua: the idempotency key may have been applied before")

// maxSeenPerCall bounds the op keys of one seen_add or seen_seed call, so
// one call's work stays bounded (invariant 13): each key costs a call
// ~8 µs of Redis with warm caches and ~12 µs after an idle pause, so 256 a
// call took 2-2.4 ms (the persister's catch-up after a burst, bench/worst.go
// "consume through every tier"); 16 take ~270 µs. The calls are sent one
// after another, not pipelined: a pipeline would hold Redis for all of them
// at once.
const maxSeenPerCall = 16

// Compile-time check that Store keeps the seen filter.
var _ engine.SeenFilter = (*Store)(nil)

// seenPeriod is the filter period of instant t.
func seenPeriod(t time.Time) int64 { return t.UnixMilli() / idempotency.SeenPeriod.Milliseconds() }

// seenTTL is how long after now period w's hash is still consulted by some
// call (idempotency.SeenPeriods periods after the period began), plus a day
// of slack for clocks: a TTL, not an instant, because now is the service's
// clock (invariant 6) and Redis expires by its own.
func seenTTL(w int64, now time.Time) int64 {
	return (w+idempotency.SeenPeriods)*idempotency.SeenPeriod.Milliseconds() + (24 * time.Hour).Milliseconds() - now.UnixMilli()
}

// seenMark is partition p's seeded mark; seenHash its filter of period w.
// Both names are new with the periods: a Redis that holds the weekly
// filter before them (":seen" and ":seen:<week>") has no mark under these,
// so its partitions are seeded again from Postgres into the periods, and
// the week hashes lapse by their TTLs.
func (s *Store) seenMark(p int) string { return s.tag(p) + seenMarkSuffix }
func (s *Store) seenHash(p int, w int64) string {
	return s.tag(p) + seenHashInfix + strconv.FormatInt(w, 10)
}

const (
	seenMarkSuffix = ":seen:from"
	seenHashInfix  = ":seen:p"
)

// seenKeys are the filter keys a money call of partition p at now
// consults: the seeded mark, then the period hashes newest first. They
// change once a period, and every money call with an idempotency key needs
// them: built once per partition and period (seenSet), so callers must not
// modify the slice (they append it to their own keys).
func (s *Store) seenKeys(p int, now time.Time) []string {
	if now.IsZero() {
		now = s.clock.Now()
	}
	w := seenPeriod(now)
	if set := s.seen[p].Load(); set != nil && set.period == w {
		return set.keys
	}
	keys := make([]string, 0, 1+idempotency.SeenPeriods)
	keys = append(keys, s.seenMark(p))
	for i := int64(0); i < idempotency.SeenPeriods; i++ {
		keys = append(keys, s.seenHash(p, w-i))
	}
	s.seen[p].Store(&seenSet{period: w, keys: keys})
	return keys
}

// seenSet is one partition's seenKeys for one period.
type seenSet struct {
	period int64
	keys   []string
}

// seenCtxKey carries a money call's filter keys from appliedFirst to
// runMoney, which appends them after the op key (the scripts' last key).
type seenCtxKey struct{}

func withSeen(ctx context.Context, keys []string) context.Context {
	return context.WithValue(ctx, seenCtxKey{}, keys)
}

func seenOf(ctx context.Context) []string {
	keys, _ := ctx.Value(seenCtxKey{}).([]string)
	return keys
}

// forgetOps adds the op keys of ms, committed operations of partition p,
// to this period's filter and shortens them to idempotency.OpKeyGrace
// (seen_add.lua), maxSeenPerCall at a time.
func (s *Store) forgetOps(ctx context.Context, p int, ms []engine.Mutation) error {
	now := s.clock.Now()
	w := seenPeriod(now)
	hash := s.seenHash(p, w)
	keys := make([]string, 0, 1+min(len(ms), maxSeenPerCall))
	flush := func() error {
		if len(keys) < 2 {
			return nil
		}
		err := s.call(ctx, seenAddScript, keys, idempotency.OpKeyGrace.Milliseconds(), seenTTL(w, now)).Err()
		keys = keys[:0]
		if err != nil {
			return fmt.Errorf("lua: forget op keys of partition %d: %w", p, s.unavail.classify(err))
		}
		return nil
	}
	for i := range ms {
		m := &ms[i]
		if m.IdempotencyKey == "" {
			continue
		}
		if len(keys) == 0 {
			keys = append(keys, hash)
		}
		keys = append(keys, s.opKeyOf(m.CustomerID, m.IdempotencyKey))
		if len(keys) > maxSeenPerCall {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// SeenSeeded reports, per filter, the instant it was last seeded from
// (engine.SeenFilter): the Partitions partitions' filters, then the
// UsageSlots usage filters (usage_ids.go); zero for a filter never seeded
// (its money calls ask Postgres whenever an op key is absent, its usage
// batches whenever an event id has no claim).
func (s *Store) SeenSeeded(ctx context.Context) ([]time.Time, error) {
	out := make([]time.Time, Partitions+UsageSlots)
	for p := range out {
		v, err := s.rdb.Get(ctx, s.filterMark(p)).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return out, fmt.Errorf("lua: seen marks: %w", s.unavail.classify(err))
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return out, fmt.Errorf("lua: seen mark of partition %d: %q", p, v)
		}
		out[p] = time.UnixMilli(ms)
	}
	return out, nil
}

// filterMark is filter p's seeded mark: partition p's (seenMark) below
// Partitions, else usage slot p-Partitions's (usageMark).
func (s *Store) filterMark(p int) string {
	if p < Partitions {
		return s.seenMark(p)
	}
	return s.usageMark(p - Partitions)
}

// filterHash is filter p's hash of period w (filterMark's numbering).
func (s *Store) filterHash(p int, w int64) string {
	if p < Partitions {
		return s.seenHash(p, w)
	}
	return s.usageSeenHash(p-Partitions, w)
}

// SeedSeen adds refs, operations Postgres holds, to their partitions'
// filters of this period, and the usage events among them to their usage
// slots' filters too (engine.SeenFilter); with done it then marks every
// filter in parts (SeenSeeded's numbering) seeded from the instant from.
func (s *Store) SeedSeen(ctx context.Context, refs []engine.OpRef, parts []int, from time.Time, done bool) error {
	now := s.clock.Now()
	w := seenPeriod(now)
	var byPart [Partitions + UsageSlots][]any
	for _, r := range refs {
		p := Partition(r.Customer.CustomerID)
		byPart[p] = append(byPart[p], s.opKeyOf(r.Customer.CustomerID, r.Key))
		if id, ok := usageEventID(r.Key); ok {
			k, slot := s.usageClaimKey(r.Customer.TenantID, r.Customer.Environment, id)
			n := Partitions + slot
			byPart[n] = append(byPart[n], k)
		}
	}
	var marked [Partitions + UsageSlots]bool
	for _, p := range parts {
		if p < 0 || p >= len(marked) {
			return fmt.Errorf("lua: seed the seen filter: filter %d", p)
		}
		marked[p] = done
	}
	for p := range len(marked) {
		names := byPart[p]
		wantMark := marked[p]
		for len(names) > 0 || wantMark {
			n := min(len(names), maxSeenPerCall)
			last := n == len(names)
			m := ""
			if last && wantMark {
				m = strconv.FormatInt(from.UnixMilli(), 10)
			}
			args := append([]any{seenTTL(w, now), m}, names[:n]...)
			if err := s.call(ctx, seenSeedScript, []string{s.filterMark(p), s.filterHash(p, w)}, args...).Err(); err != nil {
				return fmt.Errorf("lua: seed the seen filter of partition %d: %w", p, s.unavail.classify(err))
			}
			names = names[n:]
			if last {
				break
			}
		}
	}
	return nil
}
