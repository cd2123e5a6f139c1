package lua

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// Compile-time check that Store keeps the hot credit state.
var _ engine.BlockStore = (*Store)(nil)

// reservationKeep is how long a finalized reservation stays in the account hash
// (prelude/reservations.lua RES_KEEP_MS), so a quick second commit or release answers
// 409 without asking Postgres.
const reservationKeep = 10 * time.Minute

// opKeyOf is the op key of an idempotency key for customer c: the key text is
// hashed (sha256, 32 hex digits) so client text never reaches a key name.
func (s *Store) opKeyOf(c uuid.UUID, idempotencyKey string) string {
	sum := sha256.Sum256([]byte(idempotencyKey))
	return s.opKey(c, hex.EncodeToString(sum[:])[:32])
}

// moneyKeys are the keys of a money script for c: account, outbox, expiry
// zset and, with an idempotency key, the op key.
func (s *Store) moneyKeys(c uuid.UUID, idempotencyKey string) []string {
	p := Partition(c)
	keys := []string{s.accountKey(c), s.outboxKey(p)}
	if idempotencyKey != "" {
		keys = append(keys, s.opKeyOf(c, idempotencyKey))
	}
	return keys
}

// jsonText is v as JSON text for a script to splice, "" for empty metadata
// and nil reasons (the scripts then omit the member).
func jsonText(v any) (string, error) {
	switch x := v.(type) {
	case engine.Metadata:
		if len(x) == 0 {
			return "", nil
		}
	case *string:
		if x == nil {
			return "", nil
		}
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// Grant adds cmd.Block to the customer (grant.lua): it expires due blocks
// first, stacks the block after the latest matching one under StackAfter,
// creates the account on the first grant and appends the Mutation to the
// outbox. Errors: engine.ErrStateMissing, ErrStackNoMatch, ErrOverflow,
// ErrIdempotencyMismatch; a retried idempotency key returns the original
// Mutation with Replayed set.
func (s *Store) Grant(ctx context.Context, cmd engine.GrantCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.grant(ctx, cmd) })
}

// grant is Grant once Postgres does not hold the key (appliedFirst).
func (s *Store) grant(ctx context.Context, cmd engine.GrantCommand) (engine.MutationResult, error) {
	keys, args, err := s.grantArgs(cmd)
	if err != nil {
		return engine.MutationResult{}, err
	}
	if cmd.StackAfter == nil {
		return s.runMoney(ctx, grantScript, "grant", keys, args.list())
	}
	// stack_after: Go finds the latest matching block (bounded.go); the
	// script refuses with STALE when the account moved since.
	for range staleRetries {
		start, ok, version, err := s.stackStart(ctx, cmd.Customer.CustomerID, cmd.StackAfter.MetadataMatch, cmd.StackAfter.Fallback, cmd.Now)
		if err != nil {
			return engine.MutationResult{}, err
		}
		args.Stack = stackArgsOf(start, ok, version)
		res, err := s.runMoney(ctx, grantScript, "grant", keys, args.list())
		if !errors.Is(err, errStale) {
			return res, err
		}
	}
	return engine.MutationResult{}, errStaleGaveUp
}

// GrantBatch runs grants in one pipelined round trip, one grant.lua call
// each (so each call's work stays bounded), and returns each one's error
// (nil when it applied or replayed), as Grant would. Import uses it: a
// customer's blocks cost one round trip instead of one each.
func (s *Store) GrantBatch(ctx context.Context, cmds []engine.GrantCommand) []error {
	looked := time.Now()
	refs := make([]appliedRef, len(cmds))
	for i, cmd := range cmds {
		refs[i] = appliedRef{customer: cmd.Customer, key: cmd.IdempotencyKey, requestHash: cmd.RequestHash}
	}
	done, errs, err := s.appliedBatch(ctx, refs)
	if err != nil {
		errs = make([]error, len(cmds))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	ctx, cancel := context.WithDeadline(ctx, looked.Add(idempotency.AppliedLookupFresh))
	defer cancel()
	keys := make([][]string, len(cmds))
	args := make([][]any, len(cmds))
	for i, cmd := range cmds {
		if !done[i] { // else answered from Postgres (appliedBatch)
			var a *grantArgv
			if keys[i], a, errs[i] = s.grantArgs(cmd); errs[i] == nil {
				args[i] = a.list()
			}
		}
	}
	for i, v := range s.pipelined(ctx, grantScript, "grant", keys, args, errs) {
		if errs[i] == nil && args[i] != nil {
			_, _, errs[i] = mutationReply("grant", v)
		}
	}
	s.ackBatch(ctx, keys, errs)
	return errs
}

// pipelined runs script once for each i with args[i] set and errs[i] nil,
// all in one pipelined round trip (in order, so one customer's calls apply
// in the slice's order), and returns each call's reply; a call's failure
// lands in errs[i]. When the server lost the script, it is loaded and the
// calls it refused run again, once.
func (s *Store) pipelined(ctx context.Context, sc *script, name string, keys [][]string, args [][]any, errs []error) []any {
	out := make([]any, len(args))
	pending := make([]bool, len(args))
	for i := range args {
		pending[i] = errs[i] == nil && args[i] != nil
	}
	for attempt := 0; attempt < 2; attempt++ {
		pipe := s.rdb.Pipeline()
		calls := make([]*redis.Cmd, len(args))
		for i := range args {
			if pending[i] {
				calls[i] = s.queue(ctx, pipe, sc, keys[i], args[i]...)
			}
		}
		_, _ = pipe.Exec(ctx)
		noScript := false
		for i, c := range calls {
			if c == nil {
				continue
			}
			v, err := c.Result()
			if err != nil && s.missing(err) {
				noScript = true
				continue
			}
			pending[i] = false
			if err != nil {
				errs[i] = scriptError(name, s.unavail.classify(err))
				continue
			}
			out[i] = v
		}
		if !noScript {
			break
		}
		// After a server restart: load the script and run what it refused.
		if err := s.prepare(ctx, sc); err != nil {
			for i := range args {
				if pending[i] {
					errs[i], pending[i] = scriptError(name, err), false
				}
			}
			break
		}
	}
	for i := range args {
		if pending[i] {
			errs[i] = fmt.Errorf("lua: %s: the script is not loaded", name)
		}
	}
	return out
}

// ackBatch makes the grants of a batch that applied wait for the replicas
// (WithReplicaAcks): one mark and WAIT per slot covers every earlier write
// of the slot (ackMark), so a slot whose wait runs out turns its applied
// grants into engine.ErrNotReplicated.
func (s *Store) ackBatch(ctx context.Context, keys [][]string, errs []error) {
	acked := map[string]bool{}
	for i, err := range errs {
		if err != nil || len(keys[i]) == 0 {
			continue
		}
		node, want, aerr := s.ackNode(ctx, keys[i][0])
		if aerr == nil && node == nil {
			return // acks are off
		}
		tag := keys[i][1] // the partition's outbox key names the slot
		ok, seen := acked[tag]
		if !seen {
			ok = aerr == nil && (want == 0 || s.ackMark(ctx, keys[i][0], want) >= want)
			acked[tag] = ok
		}
		if !ok {
			errs[i] = engine.ErrNotReplicated
		}
	}
}

// grantArgs are the keys and arguments of grant.lua for cmd.
func (s *Store) grantArgs(cmd engine.GrantCommand) ([]string, *grantArgv, error) {
	if err := checkSource(cmd.Block.Source); err != nil {
		return nil, nil, fmt.Errorf("lua: grant: %w", err)
	}
	if cmd.StackAfter != nil && cmd.DurationSeconds <= 0 {
		return nil, nil, errors.New("lua: grant: stack_after needs a duration")
	}
	head, err := newHead(cmd.Now, cmd.OpID, cmd.Customer, cmd.IdempotencyKey, cmd.RequestHash)
	if err != nil {
		return nil, nil, err
	}
	reason, err := jsonText(cmd.Reason)
	if err != nil {
		return nil, nil, err
	}
	entryMeta, err := jsonText(cmd.EntryMetadata)
	if err != nil {
		return nil, nil, err
	}
	blockMeta, err := jsonText(cmd.Block.Metadata)
	if err != nil {
		return nil, nil, err
	}
	scope := ""
	if cmd.Block.AppliesTo != nil {
		for _, k := range cmd.Block.AppliesTo.BillableMetricKeys {
			if !engine.ValidMetricKey(k) {
				return nil, nil, fmt.Errorf("lua: grant: scope key %q is not a metric key", k)
			}
		}
		scope = engine.ScopeText(cmd.Block.AppliesTo.BillableMetricKeys)
	}
	nowMS := cmd.Now.UnixMilli()
	expires := ""
	switch {
	case cmd.Block.ExpiresAt != nil:
		expires = strconv.FormatInt(cmd.Block.ExpiresAt.UnixMilli(), 10)
	case cmd.DurationSeconds > 0:
		expires = strconv.FormatInt(nowMS+cmd.DurationSeconds*1000, 10)
	}
	stackMS, fallback, match := "", "", "{}"
	if cmd.StackAfter != nil {
		stackMS = strconv.FormatInt(cmd.DurationSeconds*1000, 10)
		fallback = cmd.StackAfter.Fallback
		if fallback == "" {
			fallback = engine.FallbackNow
		}
		if len(cmd.StackAfter.MetadataMatch) > 0 {
			b, err := json.Marshal(cmd.StackAfter.MetadataMatch)
			if err != nil {
				return nil, nil, err
			}
			match = string(b)
		}
	}
	a := &grantArgv{headArgv: head,
		AccountID: compactText(cmd.AccountID), EntryType: string(cmd.EntryType), Reason: reason, EntryMeta: entryMeta,
		BlockID: engine.CompactID(cmd.Block.ID), Amount: strconv.FormatInt(cmd.Block.OriginalAmount, 10),
		Priority: strconv.Itoa(cmd.Block.Priority), Source: string(cmd.Block.Source), BlockMeta: blockMeta,
		Expires: expires, StackMS: stackMS, StackFallback: fallback, StackMatch: match,
		Ctx: contextText(cmd.Context), Cap: capText(cmd.AccumulationCap), Scope: scope}
	return s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a, nil
}

// capText is the cap argument of grant.lua: "" when there is none.
func capText(cap *int64) string {
	if cap == nil {
		return ""
	}
	return strconv.FormatInt(*cap, 10)
}

// Debit drains cmd.Amount from the customer's started blocks in spend order
// (debit.lua), one ledger entry per block, after expiring due blocks; it
// changes nothing when refused. Errors: engine.ErrStateMissing,
// ErrInsufficientCredits, ErrNoAccount, ErrIdempotencyMismatch.
func (s *Store) Debit(ctx context.Context, cmd engine.DebitCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.debit(ctx, cmd) })
}

// debit is Debit once Postgres does not hold the key (appliedFirst).
func (s *Store) debit(ctx context.Context, cmd engine.DebitCommand) (engine.MutationResult, error) {
	head, err := newHead(cmd.Now, cmd.OpID, cmd.Customer, cmd.IdempotencyKey, cmd.RequestHash)
	if err != nil {
		return engine.MutationResult{}, err
	}
	reason, err := jsonText(cmd.Reason)
	if err != nil {
		return engine.MutationResult{}, err
	}
	entryMeta, err := jsonText(cmd.EntryMetadata)
	if err != nil {
		return engine.MutationResult{}, err
	}
	source := ""
	if cmd.Source != nil {
		source = string(*cmd.Source)
	}
	a := debitArgv{headArgv: head, Amount: strconv.FormatInt(cmd.Amount, 10), EntryType: string(cmd.EntryType),
		Source: source, Reason: reason, EntryMeta: entryMeta, Ctx: contextText(cmd.Context)}
	return s.runMoney(ctx, debitScript, "debit", s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
}

// runMoney runs a money script and decodes its Mutation. With replica acks
// on (WithReplicaAcks) the script and a WAIT share one round trip on the
// slot master's connection, and an applied or replayed Mutation that did
// not reach the replicas is engine.ErrNotReplicated, not an answer. A
// refusal (a script error) is answered as it is: it moved no money.
func (s *Store) runMoney(ctx context.Context, script *script, name string, keys []string, args []any) (engine.MutationResult, error) {
	if seen := seenOf(ctx); seen != nil {
		// After the op key, the money scripts' last key (appliedFirst sets
		// seen only for a call with an idempotency key).
		keys = append(keys[:len(keys):len(keys)], seen...)
	}
	node, want, err := s.ackNode(ctx, keys[0])
	if err != nil {
		return engine.MutationResult{}, scriptError(name, s.unavail.classify(err))
	}
	var v any
	acked := 0
	switch d := engine.FusedDoorOf(ctx); {
	case want == 0 && d.Open() && s.FusesDoors():
		v, err = s.callFused(ctx, script, d, keys, args)
		if errors.Is(err, engine.ErrFusedStale) {
			return engine.MutationResult{}, err
		}
	case want == 0:
		v, err = s.call(ctx, script, keys, args...).Result()
	default:
		// The node's own client has no hook: a dead master's dial error
		// must still be a 503 and refresh the slot map.
		v, acked, err = s.runAcked(ctx, node, script, keys, args, want)
		err = s.unavail.classify(err)
	}
	if err != nil {
		return engine.MutationResult{}, scriptError(name, err)
	}
	res, _, err := mutationReply(name, v)
	if err != nil || want == 0 {
		return res, err
	}
	if !s.acknowledged(ctx, res, keys[0], acked, want) {
		return engine.MutationResult{}, engine.ErrNotReplicated
	}
	return res, nil
}

// Expire records the expiry of every block of c whose expires_at is at or
// before now (expire.lua). ok is false, with nothing written and the version
// unchanged, when no block is due. Errors: engine.ErrStateMissing.
func (s *Store) Expire(ctx context.Context, opID uuid.UUID, c engine.CustomerKey, now time.Time) (engine.MutationResult, bool, error) {
	p := Partition(c.CustomerID)
	keys := []string{s.accountKey(c.CustomerID), s.outboxKey(p)}
	a := expireArgv{Now: strconv.FormatInt(now.UnixMilli(), 10), OpID: opID.String(), Tenant: c.TenantID.String(),
		Env: string(c.Environment), Customer: c.CustomerID.String()}
	v, err := s.call(ctx, expireScript, keys, a.list()...).Result()
	if err != nil {
		return engine.MutationResult{}, false, scriptError("expire", err)
	}
	return mutationReply("expire", v)
}

// Snapshot reads c's account as of now (one HGETALL, decoded in Go): balances by
// engine.ComputeBalances and the blocks live at now in spend order, so a
// block past expires_at no longer counts even before the sweep expires it.
// ID is "" and UpdatedAt the zero time when no account exists yet. Errors:
// engine.ErrStateMissing.
func (s *Store) Snapshot(ctx context.Context, c engine.CustomerKey, now time.Time) (engine.Account, error) {
	r, err := s.readAccount(ctx, s.accountKey(c.CustomerID))
	if err != nil {
		return engine.Account{}, err
	}
	nowMS := now.UnixMilli()
	live := make([]engine.MutationBlock, 0, len(r.blocks))
	for _, b := range r.blocks {
		if b.Live(nowMS) {
			live = append(live, b)
		}
	}
	engine.SpendOrder(live)
	bal := engine.ComputeBalances(live, r.reserved, nowMS).WithDebt(r.debt)
	acct := engine.Account{
		ID:                 r.id,
		TenantID:           c.TenantID,
		CustomerID:         c.CustomerID,
		Environment:        c.Environment,
		Balance:            bal.Balance,
		ReservedBalance:    bal.Reserved,
		PendingBalance:     bal.Pending,
		EffectiveBalance:   bal.Effective,
		LifetimeEarned:     r.lifetimeEarned,
		DebtMC:             r.debt,
		ReservationMetrics: r.reservationMetrics,
		Version:            r.version,
		Blocks:             make([]engine.Block, 0, len(live)),
	}
	if r.id != "" {
		acct.UpdatedAt = time.UnixMilli(r.updatedMS).UTC()
	}
	for _, b := range live {
		acct.Blocks = append(acct.Blocks, b.Block(c.CustomerID))
	}
	return acct, nil
}

// due reads up to limit members of a partition's zset scored at or before
// now, soonest first; what names the caller in errors.
func (s *Store) due(ctx context.Context, what string, p int, key string, now time.Time, limit int) ([]string, error) {
	if p < 0 || p >= Partitions {
		return nil, fmt.Errorf("lua: %s: partition %d out of range", what, p)
	}
	if limit <= 0 {
		return nil, nil
	}
	members, err := s.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: int64(limit),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("lua: %s: %w", what, err)
	}
	return members, nil
}

// parseExpiryMember reads a "tenant|env|customer" member (the prefix of a
// reservation-expiry zset member).
func parseExpiryMember(m string) (engine.CustomerKey, error) {
	parts := strings.Split(m, "|")
	if len(parts) != 3 {
		return engine.CustomerKey{}, fmt.Errorf("bad expiry member %q", m)
	}
	t, err1 := uuid.Parse(parts[0])
	c, err2 := uuid.Parse(parts[2])
	if err := errors.Join(err1, err2); err != nil {
		return engine.CustomerKey{}, fmt.Errorf("bad expiry member %q: %w", m, err)
	}
	return engine.CustomerKey{TenantID: t, Environment: engine.Environment(parts[1]), CustomerID: c}, nil
}

// Load installs st unless the store holds this or a newer version of the
// account (load.lua, invariant 5), reporting whether it wrote: blocks,
// gauges, active reservations (also in the partition's reservation-expiry zset) and reservations
// finalized less than a day ago (so a second commit or release is a 409);
// older finalized reservations are left out. It writes no op key: Postgres
// answers a retry of st.Applied (appliedFirst). The instant is the store
// clock's; LoadAt takes it explicitly.
func (s *Store) Load(ctx context.Context, st engine.AccountState) (bool, error) {
	return s.LoadAt(ctx, st, s.clock.Now())
}

// LoadAt is Load with the instant finalized reservations are judged at.
func (s *Store) LoadAt(ctx context.Context, st engine.AccountState, now time.Time) (bool, error) {
	var b loadCall
	if err := s.loadArgs(&b, st, now); err != nil {
		return false, err
	}
	got, err := s.call(ctx, loadScript, b.keys, b.argv()...).Int64Slice()
	if err != nil {
		return false, scriptError("load", err)
	}
	if len(got) != 1 {
		return false, fmt.Errorf("lua: load: %d replies for one account", len(got))
	}
	return got[0] == 1, nil
}

// loadBatchMax is how many accounts one load.lua call carries at most: the
// script's fixed cost is paid once per call, and a call stays well under a
// millisecond of Redis time.
const loadBatchMax = 64

// LoadBatch loads many states, each fenced like Load, with one load.lua
// call per partition and up to loadBatchMax accounts, all calls pipelined in
// one round trip (per cluster node): a rebuild of a million accounts is
// bound by Redis running the script, so Go prepares every hash field
// (lua/load.go) and a call's fixed cost is shared by a batch. It reports,
// per state, whether it wrote.
func (s *Store) LoadBatch(ctx context.Context, states []engine.AccountState) ([]bool, error) {
	if len(states) == 0 {
		return nil, nil
	}
	if err := s.prepare(ctx, loadScript); err != nil {
		return nil, fmt.Errorf("lua: load script: %w", err)
	}
	now := s.clock.Now()
	var byPart [Partitions][]int
	for i, st := range states {
		p := Partition(st.CustomerID)
		byPart[p] = append(byPart[p], i)
	}
	var calls []*loadCall
	for _, idx := range byPart {
		for from := 0; from < len(idx); from += loadBatchMax {
			c := &loadCall{index: idx[from:min(from+loadBatchMax, len(idx))]}
			for _, i := range c.index {
				if err := s.loadArgs(c, states[i], now); err != nil {
					return nil, err
				}
			}
			calls = append(calls, c)
		}
	}
	_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range calls {
			c.cmd = s.queue(ctx, pipe, loadScript, c.keys, c.argv()...)
		}
		return nil
	})
	if err != nil && calls[len(calls)-1].cmd == nil {
		return nil, fmt.Errorf("lua: load batch: %w", err)
	}
	out := make([]bool, len(states))
	for _, c := range calls {
		got, err := c.cmd.Int64Slice()
		if err != nil {
			return nil, scriptError("load", err)
		}
		if len(got) != len(c.index) {
			return nil, fmt.Errorf("lua: load: %d replies for %d accounts", len(got), len(c.index))
		}
		for j, i := range c.index {
			out[i] = got[j] == 1
		}
	}
	return out, nil
}

// checkSource refuses a source the block encoding cannot hold: its fields
// are separated by "|".
func checkSource(s engine.Source) error {
	if strings.Contains(string(s), "|") {
		return fmt.Errorf("source %q contains '|'", s)
	}
	return nil
}

// compactMeta is block metadata as the compact JSON text the block encoding
// stores, "" when empty (the encoding keeps metadata only when non-empty).
func compactMeta(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	// Postgres jsonb reorders members and rewrites numbers; the door's
	// canonical form, encoded as jsonText encodes it, makes a rebuilt block
	// byte-identical to the one the grant wrote.
	var m engine.Metadata
	if err := json.Unmarshal(raw, &m); err != nil {
		return "", err
	}
	for k, v := range m {
		c, err := engine.CanonicalValue(v)
		if err != nil {
			return "", err
		}
		m[k] = c
	}
	return jsonText(m)
}

// compactText is id as an account hash keeps it (engine.CompactID), ""
// for the nil UUID.
func compactText(id uuid.UUID) string {
	if id == uuid.Nil {
		return ""
	}
	return engine.CompactID(id)
}

// contextText is the optional request context as the JSON the scripts
// splice into the Mutation, "" when there is none.
func contextText(mc *engine.MutationContext) string {
	if mc == nil {
		return ""
	}
	b, err := json.Marshal(mc)
	if err != nil {
		return ""
	}
	return string(b)
}

// ReservationBacklog counts, in every partition, the reservations due to lapse at now:
// the work the reservation sweep has not done yet (one pipelined round of
// ZCOUNTs). The expiry sweep's backlog is Postgres' (persist.DueExpiryCount).
func (s *Store) ReservationBacklog(ctx context.Context, now time.Time) (reservations [Partitions]int64, err error) {
	upTo := strconv.FormatInt(now.UnixMilli(), 10)
	var reservation [Partitions]*redis.IntCmd
	_, err = s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for p := range Partitions {
			reservation[p] = pipe.ZCount(ctx, s.reservationExpiryKey(p), "-inf", upTo)
		}
		return nil
	})
	if err != nil {
		return reservations, fmt.Errorf("lua: reservation backlog: %w", err)
	}
	for p := range Partitions {
		reservations[p] = reservation[p].Val()
	}
	return reservations, nil
}
