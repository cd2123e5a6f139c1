package lua

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// The tenant index of usage event ids (issue 26, engine.UsageIDs): a claim
// per (tenant, environment, event id) naming the customer charged for it
// (usage_claim.lua says how a claim is kept). A usage batch claims its ids
// in one pipelined round trip before its consumes and releases those whose
// consume did not apply in one more; the persister records a committed
// event's id in the usage filter of its slot and shortens its claim to
// idempotency.UsageClaimGrace (forgetUsage), as it does an op key.

var (
	//go:embed usage_claim.lua
	usageClaimLua    string
	usageClaimScript = newScript("usage_claim", usageClaimLua)
)

// Compile-time check that Store keeps the usage index.
var _ engine.UsageIDs = (*Store)(nil)

// UsageSlots is how many hash tags the usage index spreads over, by a hash
// of the tenant, environment and event id: 32, as the customers'
// partitions, so one tenant's ids load every master of a Cluster, not the
// one its own tag would name. It is part of every claim's name: keep it.
const UsageSlots = 32

// usageClaimHashLen bytes of sha256(tenant, environment, event id) name a
// claim: 96 bits, so two live ids share a name with odds ~1e-11 at a
// billion ids (the HTTP record's choice, idemKeyHashLen).
const usageClaimHashLen = 12

// usageTag is the hash tag of usage slot n: "{prefix:u:NN}".
func (s *Store) usageTag(n int) string { return s.usageTags[n] }

// usageMark is usage slot n's seeded mark (as a partition's, seenMark).
func (s *Store) usageMark(n int) string { return s.usageTag(n) + seenMarkSuffix }

// usageSeenKeys are the usage filter keys a claim in slot n consults at
// now: the seeded mark, then the period hashes newest first; built once
// per slot and period, so callers must not modify the slice.
func (s *Store) usageSeenKeys(n int, now time.Time) []string {
	w := seenPeriod(now)
	if set := s.usageSeen[n].Load(); set != nil && set.period == w {
		return set.keys
	}
	keys := make([]string, 0, 1+idempotency.SeenPeriods)
	keys = append(keys, s.usageMark(n))
	for i := int64(0); i < idempotency.SeenPeriods; i++ {
		keys = append(keys, s.usageSeenHash(n, w-i))
	}
	s.usageSeen[n].Store(&seenSet{period: w, keys: keys})
	return keys
}

// usageClaimKey is the claim of event id of tenant and env and its usage
// slot: "{prefix:u:NN}:c:" and 16 base64url characters of the hash, NN
// (the slot) its first byte modulo UsageSlots.
func (s *Store) usageClaimKey(tenant uuid.UUID, env engine.Environment, eventID string) (key string, slot int) {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(env))
	h.Write([]byte{0})
	h.Write([]byte(eventID))
	var sum [sha256.Size]byte
	b := h.Sum(sum[:0])
	var name [16]byte
	base64.RawURLEncoding.Encode(name[:], b[:usageClaimHashLen])
	slot = int(b[0]) % UsageSlots
	return s.usageTag(slot) + ":c:" + string(name[:]), slot
}

// UsageClaimKey is the Redis key of the claim of event id of tenant and
// env, for tests that watch a claim's life.
func (s *Store) UsageClaimKey(tenant uuid.UUID, env engine.Environment, eventID string) string {
	k, _ := s.usageClaimKey(tenant, env, eventID)
	return k
}

// UsageIDsClaim claims each claim's event id for its customer, or looks
// (usage_claim.lua 'm': 'c', 'l'), consulting the usage filter of the id's
// slot when no claim holds it. One call takes up to maxSeenPerCall ids, of
// any slots on a single Redis, of one slot on a Cluster (a script's keys
// share a slot there); the calls go in one pipelined round trip (on a
// Cluster, one per master the slots live on). The first TTL of a fresh
// claim is idempotency.UsageClaimRetention.
func (s *Store) UsageIDsClaim(ctx context.Context, tenant uuid.UUID, env engine.Environment, claims []engine.UsageClaim) ([]engine.UsageHold, []error) {
	keys := make([][]string, len(claims))
	errs := make([]error, len(claims))
	now := s.clock.Now()
	// Each id's keys: its claim, its slot's seeded mark and period hashes
	// (usageSeenKeys).
	head := []any{"m", idempotency.UsageClaimRetention.Milliseconds(), 2 + idempotency.SeenPeriods}
	b := s.newUsageCalls()
	for i, c := range claims {
		k, slot := s.usageClaimKey(tenant, env, c.EventID)
		seen := s.usageSeenKeys(slot, now)
		keys[i] = append(append(make([]string, 0, 1+len(seen)), k), seen...)
		op := "c"
		if c.LookOnly {
			op = "l"
		}
		b.add(slot, i, keys[i], head, op, string(c.Customer[:]))
	}
	calls := b.calls
	callKeys, callArgs, callErrs := b.lists(calls)
	replies := s.pipelined(ctx, usageClaimScript, "usage_claim", callKeys, callArgs, callErrs)
	holds := make([]engine.UsageHold, len(claims))
	for n, cl := range calls {
		vs, ok := replies[n].([]any)
		if callErrs[n] == nil && (!ok || len(vs) != len(cl.at)) {
			callErrs[n] = fmt.Errorf("lua: usage claim: unexpected reply %T", replies[n])
		}
		for j, i := range cl.at {
			if callErrs[n] != nil {
				errs[i] = callErrs[n]
				continue
			}
			holds[i], errs[i] = usageHold(claims[i], vs[j])
		}
	}
	s.ackClaims(ctx, keys, claims, holds, errs)
	return holds, errs
}

// usageCalls groups a batch's usage_claim.lua calls of one id each into
// calls of up to maxSeenPerCall ids: of any slots on a single Redis, of
// one slot on a Cluster (a script's keys share a slot there).
type usageCalls struct {
	single bool
	open   map[int]*usageCall // by slot, or all under -1 on a single Redis
	calls  []*usageCall
}

// usageCall is one script call of a usageCalls: its keys and arguments,
// and the indexes of the ids it carries, in order.
type usageCall struct {
	keys []string
	args []any
	at   []int
}

func (s *Store) newUsageCalls() *usageCalls {
	_, single := s.rdb.(*redis.Client)
	return &usageCalls{single: single, open: map[int]*usageCall{}}
}

// add puts id i of slot, its keys and its arguments, in the open call of
// its group, or in a new one that head's arguments start.
func (b *usageCalls) add(slot, i int, keys []string, head []any, args ...any) {
	group := slot
	if b.single {
		group = -1
	}
	c := b.open[group]
	if c == nil || len(c.at) >= maxSeenPerCall {
		c = &usageCall{args: append(make([]any, 0, len(head)+2*maxSeenPerCall), head...)}
		b.open[group] = c
		b.calls = append(b.calls, c)
	}
	c.keys = append(c.keys, keys...)
	c.args = append(c.args, args...)
	c.at = append(c.at, i)
}

// lists are calls' keys and arguments as pipelined takes them, and their
// errors.
func (b *usageCalls) lists(calls []*usageCall) ([][]string, [][]any, []error) {
	keys, args := make([][]string, len(calls)), make([][]any, len(calls))
	for n, c := range calls {
		keys[n], args[n] = c.keys, c.args
	}
	return keys, args, make([]error, len(calls))
}

// usageHold reads claim c's reply v (usage_claim.lua's per id).
func usageHold(c engine.UsageClaim, v any) (engine.UsageHold, error) {
	switch r := v.(type) {
	case int64:
		if c.LookOnly {
			return engine.UsageHold{Seen: r == 2}, nil
		}
		return engine.UsageHold{Fresh: r != 1, Seen: r == 2}, nil
	case string:
		holder, err := uuid.FromBytes([]byte(r))
		if err != nil {
			return engine.UsageHold{}, fmt.Errorf("lua: usage claim: holder %q: %w", r, err)
		}
		return engine.UsageHold{Other: true, Holder: holder}, nil
	}
	return engine.UsageHold{}, fmt.Errorf("lua: usage claim: unexpected reply %T", v)
}

// ackClaims holds, with replica acks on (WithReplicaAcks), each claim this
// batch holds to the replicas of its master, as a money script's answer
// is held: a failover that lost a claim the charge after it outlived (the
// charge waits for its own replicas) would let another customer claim
// and charge the id until the persister records it. One fresh mark and a
// WAIT per master the held claims live on (ackMark: the replicas' offset
// past the mark is past every write before it, on any connection); a
// master short of replicas fails its claims with engine.ErrNotReplicated,
// which the event answers as retryable. A claim the retry finds is the
// customer's own, so the retry goes on. Looks and claims another customer
// holds wrote nothing and wait for nothing.
func (s *Store) ackClaims(ctx context.Context, keys [][]string, claims []engine.UsageClaim, holds []engine.UsageHold, errs []error) {
	if s.acks == nil {
		return
	}
	type master struct {
		key  string
		want int
		held []int
	}
	var masters []*master
	byNode := map[*redis.Client]*master{}
	for i := range claims {
		if errs[i] != nil || claims[i].LookOnly || holds[i].Other {
			continue
		}
		node, want, err := s.ackNode(ctx, keys[i][0])
		if err != nil {
			errs[i] = scriptError("usage_claim", s.unavail.classify(err))
			continue
		}
		if node == nil || want == 0 {
			continue
		}
		m := byNode[node]
		if m == nil {
			m = &master{key: keys[i][0], want: want}
			byNode[node] = m
			masters = append(masters, m)
		}
		m.held = append(m.held, i)
	}
	for _, m := range masters {
		if s.ackMark(ctx, m.key, m.want) >= m.want {
			continue
		}
		for _, i := range m.held {
			errs[i] = engine.ErrNotReplicated
		}
	}
}

// UsageIDsRelease releases claims (usage_claim.lua 'r'), one script each in
// one pipelined round trip; the error is the first call's that failed.
func (s *Store) UsageIDsRelease(ctx context.Context, tenant uuid.UUID, env engine.Environment, claims []engine.UsageClaim) error {
	if len(claims) == 0 {
		return nil
	}
	keys, args, errs := make([][]string, len(claims)), make([][]any, len(claims)), make([]error, len(claims))
	for i, c := range claims {
		k, _ := s.usageClaimKey(tenant, env, c.EventID)
		keys[i], args[i] = []string{k}, []any{"r", string(c.Customer[:])}
	}
	s.pipelined(ctx, usageClaimScript, "usage_claim", keys, args, errs)
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("lua: release usage claims: %w", err)
		}
	}
	return nil
}

// usageEventID is the event id of a usage event's idempotency key
// ("usage:<event id>", engine.UsageEventKey); ok is false for another key.
func usageEventID(key string) (string, bool) {
	return strings.CutPrefix(key, engine.UsageKeyPrefix)
}

// usageSeenHash is usage slot n's filter of period w.
func (s *Store) usageSeenHash(n int, w int64) string {
	return s.usageTag(n) + seenHashInfix + strconv.FormatInt(w, 10)
}

// forgetUsage records the event ids of the committed usage charges among
// ms in the usage filter of this period and shortens their claims to
// idempotency.UsageClaimGrace (usage_claim.lua 'f'): like an op key, a
// committed id is then under its claim, in the filter, or both. One call
// forgets up to maxSeenPerCall ids: of any slots on a single Redis, of
// one slot on a Cluster (a script's keys share a slot there).
func (s *Store) forgetUsage(ctx context.Context, ms []engine.Mutation) error {
	now := s.clock.Now()
	w := seenPeriod(now)
	head := []any{"f", idempotency.UsageClaimGrace.Milliseconds(), seenTTL(w, now)}
	b := s.newUsageCalls()
	for i := range ms {
		m := &ms[i]
		id, ok := usageEventID(m.IdempotencyKey)
		if !ok {
			continue
		}
		k, slot := s.usageClaimKey(m.TenantID, m.Environment, id)
		b.add(slot, i, []string{k, s.usageSeenHash(slot, w)}, head, string(m.CustomerID[:]))
	}
	calls := b.calls
	// A round trip carries maxSeenPerCall ids at most: one call on a single
	// Redis, a pipeline of one-slot calls on a Cluster (a pipeline's calls
	// run one after another, without other clients' commands between).
	for lo := 0; lo < len(calls); {
		hi, ids := lo, 0
		for hi < len(calls) && (hi == lo || ids+len(calls[hi].at) <= maxSeenPerCall) {
			ids += len(calls[hi].at)
			hi++
		}
		keys, args, errs := b.lists(calls[lo:hi])
		s.pipelined(ctx, usageClaimScript, "usage_claim", keys, args, errs)
		for _, err := range errs {
			if err != nil {
				return fmt.Errorf("lua: forget usage claims: %w", err)
			}
		}
		lo = hi
	}
	return nil
}
