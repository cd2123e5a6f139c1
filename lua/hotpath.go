package lua

import (
	"context"
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

// Compile-time check that Store prices, entitles and holds on the hot path.
var _ engine.MeteringStore = (*Store)(nil)

const (
	// maxDueReservations bounds one DueReservations page whatever the caller asks.
	maxDueReservations = 10000
	// reservationIndexSlack is how long the reservation -> customer index
	// outlives a reservation's expires_at: the sweep's window plus the time a
	// finalized reservation stays in the account hash (RES_KEEP_MS in
	// prelude/reservations.lua, 10 minutes), with room to spare.
	reservationIndexSlack = 48 * time.Hour
)

// pricedTerms is pricedTermsArg for script name: an engine error (a bad
// request, ErrOverflow) as it is, any other error named for the script.
func pricedTerms(name string, t engine.RuleTerms, units int64) (string, error) {
	terms, err := pricedTermsArg(t, units)
	if _, ok := engine.AsError(err); ok || err == nil {
		return terms, err
	}
	return "", fmt.Errorf("lua: %s: %w", name, err)
}

// checkReservation refuses a reserve without a reservation id (the nil id would
// reach the script as a valid-looking one). A reservation that would expire at
// once is the script's BADARG: engine owns ttl_seconds
// (engine.CheckReservationTTL, lua/guards_test.go).
func checkReservation(cmd engine.ReserveCommand) error {
	if cmd.ReservationID == uuid.Nil {
		return errors.New("lua: reserve: no reservation id")
	}
	return nil
}

// pricedTermsArg is termsArg for a call that prices units: a tiered rule
// is priced here by engine.Price (the function the scripts' price mirrors,
// price_test.go) and sent as flat terms of that cost, so a script never
// walks up to engine.MaxTiers tiers in Lua (invariant 13: parsing and
// pricing 100 tiers cost a script about 1.5 ms). Flat and per_unit terms go
// as they are. A cost past int64 is engine.ErrOverflow, as the script says.
func pricedTermsArg(t engine.RuleTerms, units int64) (string, error) {
	if t.CostType != engine.CostTiered || units < 1 {
		return termsArg(t)
	}
	cost, err := engine.Price(engine.MeteringRule{CostType: t.CostType, BaseCost: t.BaseCost, UnitCost: t.UnitCost,
		TierConfig: t.TierConfig}, units)
	if err != nil {
		return "", err
	}
	return termsArg(engine.RuleTerms{CostType: engine.CostFlat, BaseCost: cost})
}

// termsArg encodes a rule's pricing fields for the scripts' terms_parse:
// "cost_type|base_cost|unit_cost|mode|tiers", tiers "up_to:unit_cost:flat_cost"
// joined by ",", up_to "" for null.
func termsArg(t engine.RuleTerms) (string, error) {
	if strings.ContainsAny(string(t.CostType), "|") {
		return "", fmt.Errorf("cost type %q contains '|'", t.CostType)
	}
	var sb strings.Builder
	sb.WriteString(string(t.CostType))
	sb.WriteByte('|')
	sb.WriteString(strconv.FormatInt(t.BaseCost, 10))
	sb.WriteByte('|')
	sb.WriteString(strconv.FormatInt(t.UnitCost, 10))
	sb.WriteByte('|')
	if t.TierConfig != nil {
		if strings.ContainsAny(string(t.TierConfig.Mode), "|,:") {
			return "", fmt.Errorf("tier mode %q contains a separator", t.TierConfig.Mode)
		}
		sb.WriteString(string(t.TierConfig.Mode))
		sb.WriteByte('|')
		for i, tier := range t.TierConfig.Tiers {
			if i > 0 {
				sb.WriteByte(',')
			}
			if tier.UpTo != nil {
				sb.WriteString(strconv.FormatInt(*tier.UpTo, 10))
			}
			sb.WriteByte(':')
			sb.WriteString(strconv.FormatInt(tier.UnitCost, 10))
			sb.WriteByte(':')
			sb.WriteString(strconv.FormatInt(tier.FlatCost, 10))
		}
	} else {
		sb.WriteByte('|')
	}
	return sb.String(), nil
}

// checkMetric refuses a metric key the reservation encoding cannot hold
// (engine's metric keys never contain "|").
func checkMetric(metric string) error {
	if metric == "" || strings.Contains(metric, "|") {
		return fmt.Errorf("metric key %q is empty or contains '|'", metric)
	}
	return nil
}

// reservationKeys are the keys of reserve.lua, commit.lua and release.lua for c:
// account, outbox, expiry zset, reservation-expiry zset and, with an idempotency
// key, the op key.
func (s *Store) reservationKeys(c uuid.UUID, idempotencyKey string) []string {
	p := Partition(c)
	keys := []string{s.accountKey(c), s.outboxKey(p), s.reservationExpiryKey(p)}
	if idempotencyKey != "" {
		keys = append(keys, s.opKeyOf(c, idempotencyKey))
	}
	return keys
}

// Consume prices cmd.Units at cmd.Terms and charges them (consume.lua),
// after expiring due blocks. Under policy block a cost above the effective
// balance charges nothing and returns engine.ErrInsufficientCredits (the
// script still appends a refusal record, usage.refused, to the outbox);
// under allow and notify the charge takes what the effective balance has
// and the rest is overage. Errors: ErrInsufficientCredits, ErrOverflow,
// ErrIdempotencyMismatch, ErrStateMissing. A command engine would refuse
// (units < 1, items outside 1..engine.MaxConsumeItems) is the script's
// BADARG: engine owns those checks and names the field (lua/guards_test.go).
func (s *Store) Consume(ctx context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, cmd.AppliedCheckedAt,
		func(ctx context.Context) (engine.MutationResult, error) { return s.consume(ctx, cmd) })
}

// consume is Consume once Postgres does not hold the key (appliedFirst).
func (s *Store) consume(ctx context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	if cmd.Items != nil {
		return s.consumeMulti(ctx, cmd)
	}
	keys, args, err := s.consumeArgs(cmd)
	if err != nil {
		return engine.MutationResult{}, err
	}
	res, err := s.runMoney(ctx, consumeScript, "consume", keys, args)
	if err == nil {
		fillRecordCustomer(&res, cmd.Customer, cmd.IdempotencyKey)
	}
	return res, err
}

// consumeArgs are the keys and arguments of consume.lua for cmd.
func (s *Store) consumeArgs(cmd engine.ConsumeCommand) ([]string, []any, error) {
	if err := checkMetric(cmd.Metric); err != nil {
		return nil, nil, fmt.Errorf("lua: consume: %w", err)
	}
	if !cmd.Policy.Valid() {
		return nil, nil, fmt.Errorf("lua: consume: overage policy %q", cmd.Policy)
	}
	terms, err := pricedTerms("consume", cmd.Terms, cmd.Units)
	if err != nil {
		return nil, nil, err
	}
	head, meta, err := newHotHeadMeta(cmd.CommandHeader, cmd.Context, cmd.EntryMetadata)
	if err != nil {
		return nil, nil, err
	}
	a := consumeArgv{hotHead: head, Metric: cmd.Metric, Units: strconv.FormatInt(cmd.Units, 10), Terms: terms,
		Policy: string(cmd.Policy), Meta: meta}
	if cmd.Pool != nil {
		pa, err := poolArgs(cmd)
		if err != nil {
			return nil, nil, err
		}
		a.Pool, a.PoolOp, a.PoolCtx = pa.Pool, pa.PoolOp, pa.PoolCtx
	}
	return s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list(), nil
}

// poolArgs are the pool arguments of cmd's charge (cmd.Pool set), the
// same for consume.lua and consume_multi.lua: the parent's hash is named
// from the child's key, so it must share the child's slot.
func poolArgs(cmd engine.ConsumeCommand) (poolArgv, error) {
	p := cmd.Pool
	if Partition(p.Parent.CustomerID) != Partition(cmd.Customer.CustomerID) {
		return poolArgv{}, fmt.Errorf("lua: consume: parent %s is not in the slot of customer %s", p.Parent.CustomerID, cmd.Customer.CustomerID)
	}
	pctx := engine.AppendMutationContextJSON(nil, &p.ParentContext)
	return poolArgv{Pool: engine.PoolArg(p, cmd.Now), PoolOp: p.OpID.String(), PoolCtx: string(pctx)}, nil
}

// consumeMulti is consume for a multi-metric command (consume_multi.lua):
// every item charged in one script, or none.
func (s *Store) consumeMulti(ctx context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	keys, args, err := s.consumeMultiArgs(cmd)
	if err != nil {
		return engine.MutationResult{}, err
	}
	res, err := s.runMoney(ctx, consumeMultiScript, "consume_multi", keys, args)
	if err == nil && res.Replayed {
		fillRecordCustomer(&res, cmd.Customer, cmd.IdempotencyKey)
	}
	return res, err
}

// consumeMultiArgs are the keys and arguments of consume_multi.lua for cmd.
func (s *Store) consumeMultiArgs(cmd engine.ConsumeCommand) ([]string, []any, error) {
	if !cmd.Policy.Valid() {
		return nil, nil, fmt.Errorf("lua: consume: overage policy %q", cmd.Policy)
	}
	head, err := newHotHead(cmd.CommandHeader, cmd.Context)
	if err != nil {
		return nil, nil, err
	}
	if _, ok := cmd.EntryMetadata[engine.ItemsMetadataKey]; ok {
		return nil, nil, fmt.Errorf("lua: consume: entry metadata holds the reserved member %q", engine.ItemsMetadataKey)
	}
	meta, err := jsonText(cmd.EntryMetadata)
	if err != nil {
		return nil, nil, err
	}
	a := consumeMultiArgv{hotHead: head, Policy: string(cmd.Policy), Meta: meta, N: strconv.Itoa(len(cmd.Items)),
		Items: make([]itemArgv, len(cmd.Items))}
	for i, it := range cmd.Items {
		if err := checkMetric(it.Metric); err != nil {
			return nil, nil, fmt.Errorf("lua: consume: %w", err)
		}
		terms, err := pricedTerms("consume", it.Terms, it.Units)
		if err != nil {
			return nil, nil, err
		}
		a.Items[i] = itemArgv{Metric: it.Metric, Units: strconv.FormatInt(it.Units, 10), Terms: terms}
	}
	if cmd.Pool != nil {
		if a.Pool, err = poolArgs(cmd); err != nil {
			return nil, nil, err
		}
	}
	return s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list(), nil
}

// ConsumeBatch runs cmds as Consume would, consume.lua once each, in one
// pipelined round trip: the scripts of one customer run in cmds' order.
// Each script consults the seen filter (seen.go) for its key; only the
// calls it answers MAYBESEEN are looked up in Postgres, together, and run
// again without it (after the others: a customer's order holds for all
// but them). Keys Postgres was asked about lately (AppliedCheckedAt) skip
// the filter. Usage batches use it: a batch costs a round trip, not one
// per event.
func (s *Store) ConsumeBatch(ctx context.Context, cmds []engine.ConsumeCommand) ([]engine.MutationResult, []error) {
	out := make([]engine.MutationResult, len(cmds))
	errs := make([]error, len(cmds))
	keys := make([][]string, len(cmds))
	args := make([][]any, len(cmds))
	now := time.Now()
	oldest := now
	for i, cmd := range cmds {
		if keys[i], args[i], errs[i] = s.consumeArgs(cmd); errs[i] != nil {
			args[i] = nil
			continue
		}
		switch {
		case cmd.IdempotencyKey == "" || s.applied == nil:
		case idempotency.LookupStands(cmd.AppliedCheckedAt, now):
			// Looked up lately: the script's op key is enough.
			if cmd.AppliedCheckedAt.Before(oldest) {
				oldest = cmd.AppliedCheckedAt
			}
		default:
			keys[i] = append(keys[i], s.seenKeys(Partition(cmd.Customer.CustomerID), cmd.Now)...)
		}
	}
	runCtx, cancel := context.WithDeadline(ctx, oldest.Add(idempotency.AppliedLookupFresh))
	replies := s.pipelined(runCtx, consumeScript, "consume", keys, args, errs)
	cancel()
	// The calls the filter could not clear: Postgres answers those it
	// holds; the others run again without the filter, after the look-up.
	refs := make([]appliedRef, len(cmds))
	rerun := false
	for i, cmd := range cmds {
		if errors.Is(errs[i], errMaybeSeen) {
			refs[i] = appliedRef{customer: cmd.Customer, key: cmd.IdempotencyKey, requestHash: cmd.RequestHash}
			rerun = true
		}
	}
	var found []bool
	if rerun {
		looked := time.Now()
		done, lookErrs, err := s.appliedBatch(ctx, refs)
		again := make([][]any, len(cmds))
		for i := range cmds {
			if refs[i].key == "" {
				continue
			}
			switch {
			case err != nil:
				errs[i] = err
			case done[i]:
				errs[i] = lookErrs[i]
				if found == nil {
					found = make([]bool, len(cmds))
				}
				found[i] = true
				out[i] = engine.MutationResult{Mutation: refs[i].found, Replayed: true}
			default:
				errs[i], again[i] = nil, args[i]
				keys[i] = keys[i][:len(keys[i])-1-idempotency.SeenPeriods]
			}
		}
		runCtx, cancel := context.WithDeadline(ctx, looked.Add(idempotency.AppliedLookupFresh))
		for i, v := range s.pipelined(runCtx, consumeScript, "consume", keys, again, errs) {
			if again[i] != nil {
				replies[i] = v
			}
		}
		cancel()
	}
	for i, v := range replies {
		if errs[i] != nil || args[i] == nil || (found != nil && found[i]) {
			continue
		}
		if out[i], _, errs[i] = mutationReply("consume", v); errs[i] == nil {
			fillRecordCustomer(&out[i], cmds[i].Customer, cmds[i].IdempotencyKey)
		}
	}
	s.ackBatch(ctx, keys, errs)
	return out, errs
}

// Reserve holds the estimated cost of cmd.EstimatedUnits at cmd.Terms
// (reserve.lua): reserved_balance rises by it, the reservation is stored in the
// customer's hash and the partition's reservation-expiry zset. It then records
// reservation id -> customer and metric for ReservationRef (best effort: a lost
// record only sends the look-up to Postgres). Errors:
// ErrInsufficientCredits, ErrOverflow, ErrIdempotencyMismatch,
// ErrStateMissing; a command engine would refuse is the script's BADARG,
// as for Consume.
func (s *Store) Reserve(ctx context.Context, cmd engine.ReserveCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.reserve(ctx, cmd) })
}

// reserve is Reserve once Postgres does not hold the key (appliedFirst).
func (s *Store) reserve(ctx context.Context, cmd engine.ReserveCommand) (engine.MutationResult, error) {
	sc, name, args, err := s.reserveArgs(cmd)
	if err != nil {
		return engine.MutationResult{}, err
	}
	var ix *reservationIndex
	if cmd.Items == nil && cmd.ExpiresAt.After(cmd.Now) {
		// A single-metric record is known before the script (a multi-metric
		// one holds the costs the script prices): a fused door writes it
		// in the script's round trip.
		ix = &reservationIndex{key: s.reservationRecordKey(cmd.ReservationID),
			record: customerMember(cmd.Customer) + "|s" + cmd.Metric,
			ttlMS:  (cmd.ExpiresAt.Sub(cmd.Now) + reservationIndexSlack).Milliseconds()}
	}
	res, err := s.runMoney(withReservationIndex(ctx, ix), sc, name, s.reservationKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), args)
	if ix != nil && ix.written && err == nil {
		s.refs.put(cmd.ReservationID, ix.record, cmd.Now.Add(time.Duration(ix.ttlMS)*time.Millisecond))
		return res, nil
	}
	return s.indexReservation(ctx, cmd, res, err)
}

// reservationIndex is a reserve's index record (reservationRecord) asked
// of the fused door, which writes it after an answer that is not a replay,
// in the script's own round trip (door_fused.lua); written says it did.
type reservationIndex struct {
	key, record string
	ttlMS       int64
	written     bool
}

type reservationIndexCtxKey struct{}

func withReservationIndex(ctx context.Context, ix *reservationIndex) context.Context {
	if ix == nil {
		return ctx
	}
	return context.WithValue(ctx, reservationIndexCtxKey{}, ix)
}

func reservationIndexOf(ctx context.Context) *reservationIndex {
	ix, _ := ctx.Value(reservationIndexCtxKey{}).(*reservationIndex)
	return ix
}

// ReserveDry answers the Mutation Reserve of cmd would write, changing
// nothing (dryRun; cmd carries no idempotency key). Errors as Reserve's.
func (s *Store) ReserveDry(ctx context.Context, cmd engine.ReserveCommand) (engine.MutationResult, error) {
	if cmd.IdempotencyKey != "" {
		return engine.MutationResult{}, errors.New("lua: reserve dry run: a dry run takes no idempotency key")
	}
	sc, name, args, err := s.reserveArgs(cmd)
	if err != nil {
		return engine.MutationResult{}, err
	}
	return s.dryRun(ctx, cmd.Customer.CustomerID, uuid.Nil, name, sc, s.reservationKeys(cmd.Customer.CustomerID, ""), args)
}

// reserveArgs is the script (reserve.lua, or reserve_multi.lua for a
// multi-metric command: the items' summed estimated cost held in one
// script, or nothing) and its arguments for cmd.
func (s *Store) reserveArgs(cmd engine.ReserveCommand) (*script, string, []any, error) {
	if cmd.Items != nil {
		args, err := s.reserveMultiArgs(cmd)
		return reserveMultiScript, "reserve_multi", args, err
	}
	if err := checkMetric(cmd.Metric); err != nil {
		return nil, "", nil, fmt.Errorf("lua: reserve: %w", err)
	}
	if err := checkReservation(cmd); err != nil {
		return nil, "", nil, err
	}
	terms, err := pricedTerms("reserve", cmd.Terms, cmd.EstimatedUnits)
	if err != nil {
		return nil, "", nil, err
	}
	head, meta, err := newHotHeadMeta(cmd.CommandHeader, cmd.Context, cmd.Metadata)
	if err != nil {
		return nil, "", nil, err
	}
	a := reserveArgv{hotHead: head, ResID: cmd.ReservationID.String(), Metric: cmd.Metric,
		EstUnits: strconv.FormatInt(cmd.EstimatedUnits, 10), Terms: terms,
		Expires: strconv.FormatInt(cmd.ExpiresAt.UnixMilli(), 10), Meta: meta}
	return reserveScript, "reserve", a.list(), nil
}

// reserveMultiArgs are reserve_multi.lua's arguments for cmd.
func (s *Store) reserveMultiArgs(cmd engine.ReserveCommand) ([]any, error) {
	if err := checkReservation(cmd); err != nil {
		return nil, err
	}
	head, meta, err := newHotHeadMeta(cmd.CommandHeader, cmd.Context, cmd.Metadata)
	if err != nil {
		return nil, err
	}
	a := reserveMultiArgv{hotHead: head, ResID: cmd.ReservationID.String(),
		Expires: strconv.FormatInt(cmd.ExpiresAt.UnixMilli(), 10), Meta: meta, N: strconv.Itoa(len(cmd.Items)),
		Items: make([]itemArgv, len(cmd.Items))}
	for i, it := range cmd.Items {
		if err := checkMetric(it.Metric); err != nil {
			return nil, fmt.Errorf("lua: reserve: %w", err)
		}
		terms, err := pricedTerms("reserve", it.Terms, it.EstimatedUnits)
		if err != nil {
			return nil, err
		}
		a.Items[i] = itemArgv{Metric: it.Metric, Units: strconv.FormatInt(it.EstimatedUnits, 10), Terms: terms}
	}
	return a.list(), nil
}

// indexReservation records reservation id -> customer, metric or items after a
// reserve (reservationRecord; best effort: a lost record only sends the look-up
// to Postgres).
func (s *Store) indexReservation(ctx context.Context, cmd engine.ReserveCommand, res engine.MutationResult, err error) (engine.MutationResult, error) {
	if err != nil {
		return res, err
	}
	if r := res.Mutation.Reservation; r != nil {
		// A replay long after the reservation ended has nothing left to index.
		if ttl := time.Duration(r.ExpiresMS-cmd.Now.UnixMilli())*time.Millisecond + reservationIndexSlack; ttl > 0 {
			if rec, err := reservationRecord(cmd.Customer, r); err == nil {
				// Through the coalescer: under load the record shares a round
				// trip with concurrent requests' commands instead of paying
				// one of its own (its error is ignored as before: a reservation
				// without a record settles through Postgres).
				_ = s.trips.do(ctx, redis.NewStatusCmd(ctx, "set", s.reservationRecordKey(r.ID), rec, "px", max(ttl.Milliseconds(), 1)))
				s.refs.put(r.ID, rec, cmd.Now.Add(ttl))
			}
		}
	}
	return res, nil
}

// reservationItem is one item of a multi-metric reservation in its index record.
type reservationItem struct {
	Metric         string `json:"k"`
	EstimatedUnits int64  `json:"u"`
	EstimatedCost  int64  `json:"c"`
}

// reservationRecord is the index record of reservation r of customer c:
// "tenant|env|customer|" then "s" and the metric of a single-metric reservation,
// or "m" and the JSON list of a multi-metric reservation's items with their
// estimates (what a commit needs of the reservation before its script runs).
func reservationRecord(c engine.CustomerKey, r *engine.MutationReservation) (string, error) {
	if r.Items == nil {
		return customerMember(c) + "|s" + r.Metric, nil
	}
	items := make([]reservationItem, len(r.Items))
	for i, it := range r.Items {
		items[i] = reservationItem{Metric: it.BillableMetricKey, EstimatedUnits: it.EstimatedUnits, EstimatedCost: it.EstimatedCost}
	}
	b, err := json.Marshal(items)
	if err != nil {
		return "", err
	}
	return customerMember(c) + "|m" + string(b), nil
}

// parseReservationRecord reads a reservationRecord.
func parseReservationRecord(v string) (engine.ReservationRef, error) {
	p := strings.SplitN(v, "|", 4)
	if len(p) != 4 || p[3] == "" {
		return engine.ReservationRef{}, fmt.Errorf("bad reservation record %q", v)
	}
	c, err := parseExpiryMember(p[0] + "|" + p[1] + "|" + p[2])
	if err != nil {
		return engine.ReservationRef{}, err
	}
	ref := engine.ReservationRef{Customer: c, Described: true}
	switch rest := p[3]; rest[0] {
	case 's':
		ref.Metric = rest[1:]
	case 'm':
		var items []reservationItem
		if err := json.Unmarshal([]byte(rest[1:]), &items); err != nil || len(items) == 0 {
			return engine.ReservationRef{}, fmt.Errorf("bad reservation record %q", v)
		}
		ref.Items = make([]engine.ReservationItem, len(items))
		for i, it := range items {
			ref.Items[i] = engine.ReservationItem{BillableMetricKey: it.Metric, EstimatedUnits: it.EstimatedUnits, EstimatedCost: it.EstimatedCost}
		}
	default:
		return engine.ReservationRef{}, fmt.Errorf("bad reservation record %q", v)
	}
	return ref, nil
}

// Commit settles the active reservation cmd.ReservationID at cmd.ActualUnits
// priced at cmd.Terms (commit.lua): 0 units returns the whole reservation; more
// may use the reservation plus the free effective balance, and cmd.Metadata is
// merged key by key into the stored metadata. Errors:
// ErrReservationNotFound, ErrReservationNotActive, ErrReservationExpired
// (expires_at reached, not swept yet), ErrInsufficientCredits (the reservation
// stays active), ErrOverflow, ErrIdempotencyMismatch, ErrStateMissing.
func (s *Store) Commit(ctx context.Context, cmd engine.CommitCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.commit(ctx, cmd) })
}

// commit is Commit once Postgres does not hold the key (appliedFirst).
func (s *Store) commit(ctx context.Context, cmd engine.CommitCommand) (engine.MutationResult, error) {
	if cmd.Items != nil {
		return s.commitMulti(ctx, cmd)
	}
	terms := ""
	if cmd.ActualUnits > 0 {
		var err error
		terms, err = pricedTerms("commit", cmd.Terms, cmd.ActualUnits)
		if err != nil {
			return engine.MutationResult{}, err
		}
	}
	head, meta, err := newHotHeadMeta(cmd.CommandHeader, cmd.Context, cmd.Metadata)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := &commitArgv{hotHead: head, ResID: cmd.ReservationID.String(), Actual: strconv.FormatInt(cmd.ActualUnits, 10),
		Terms: terms, Meta: meta, Partial: flagText(cmd.Partial)}
	return s.runCommit(ctx, cmd, commitScript, "commit", a.list, &a.Merge, &a.Meta, cmd.ActualUnits > 0)
}

// runCommit runs a commit script with the arguments list gives. When it
// charges (charges) and brings metadata, Go merges the metadata
// (bounded.go) and the script checks that the reservation's stored metadata is
// still what Go merged into (STALE if not), given in merge. meta is the
// argument list's metadata: sent empty once merged, as the script then
// reads only the merge (each argument is a Lua string Redis hashes byte by
// byte: up to engine.MaxMetadataBytes for nothing).
func (s *Store) runCommit(ctx context.Context, cmd engine.CommitCommand, script *script, name string, list func() []any, merge *mergeArgv, metaArg *string, charges bool) (engine.MutationResult, error) {
	keys := s.reservationKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey)
	meta := *metaArg
	if meta == "" || !charges {
		return s.runMoney(ctx, script, name, keys, list())
	}
	for range staleRetries {
		stored, raw, found, err := s.reservationRead(ctx, cmd.Customer.CustomerID, cmd.ReservationID)
		if err != nil {
			return engine.MutationResult{}, err
		}
		if !found {
			// Not in Redis (state missing, or finalized and gone): the
			// script answers NOSTATE or NOTFOUND without merging.
			*merge, *metaArg = mergeArgv{}, meta
			return s.runMoney(ctx, script, name, keys, list())
		}
		merged, err := mergeMeta(stored, meta)
		if err != nil {
			return engine.MutationResult{}, err
		}
		*merge, *metaArg = mergeArgv{Stored: raw, Merged: merged}, ""
		res, err := s.runMoney(ctx, script, name, keys, list())
		if !errors.Is(err, errStale) {
			return res, err
		}
	}
	return engine.MutationResult{}, errStaleGaveUp
}

// commitMulti is commit for a multi-metric reservation (commit_multi.lua): every
// item priced at its own terms and charged in one script, or none.
func (s *Store) commitMulti(ctx context.Context, cmd engine.CommitCommand) (engine.MutationResult, error) {
	head, meta, err := newHotHeadMeta(cmd.CommandHeader, cmd.Context, cmd.Metadata)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := &commitMultiArgv{hotHead: head, ResID: cmd.ReservationID.String(), Meta: meta, N: strconv.Itoa(len(cmd.Items)),
		Items: make([]commitItemArgv, len(cmd.Items))}
	var charges bool
	for i, it := range cmd.Items {
		if err := checkMetric(it.Metric); err != nil {
			return engine.MutationResult{}, fmt.Errorf("lua: commit: %w", err)
		}
		terms := ""
		if it.ActualUnits > 0 {
			charges = true
			terms, err = pricedTerms("commit", it.Terms, it.ActualUnits)
			if err != nil {
				return engine.MutationResult{}, err
			}
		}
		a.Items[i] = commitItemArgv{Metric: it.Metric, EstUnits: strconv.FormatInt(it.EstimatedUnits, 10),
			EstCost: strconv.FormatInt(it.EstimatedCost, 10), Units: strconv.FormatInt(it.ActualUnits, 10), Terms: terms}
	}
	return s.runCommit(ctx, cmd, commitMultiScript, "commit_multi", a.list, &a.Merge, &a.Meta, charges)
}

// Release returns the active reservation cmd.ReservationID whole (release.lua):
// status released, or expired when cmd.Expire (the sweep; only once
// expires_at has passed). Errors: ErrReservationNotFound,
// ErrReservationNotActive, ErrReservationNotDue (Expire before expires_at;
// it also matches ErrReservationNotActive), ErrIdempotencyMismatch,
// ErrStateMissing.
func (s *Store) Release(ctx context.Context, cmd engine.ReleaseCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.release(ctx, cmd) })
}

// release is Release once Postgres does not hold the key (appliedFirst).
func (s *Store) release(ctx context.Context, cmd engine.ReleaseCommand) (engine.MutationResult, error) {
	head, err := newHotHead(cmd.CommandHeader, cmd.Context)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := releaseArgv{hotHead: head, ResID: cmd.ReservationID.String(), Expire: flagText(cmd.Expire)}
	return s.runMoney(ctx, releaseScript, "release", s.reservationKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
}

// Extend tops the active single-metric reservation cmd.ReservationID up by
// cmd.AdditionalUnits priced at cmd.Terms and/or moves its expiry to
// cmd.ExpiresAt (extend.lua), then re-records the reservation index for
// the new expiry. Errors: those of Commit, engine.ErrReservationShorter.
func (s *Store) Extend(ctx context.Context, cmd engine.ExtendCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.extend(ctx, cmd) })
}

// extend is Extend once Postgres does not hold the key (appliedFirst).
func (s *Store) extend(ctx context.Context, cmd engine.ExtendCommand) (engine.MutationResult, error) {
	terms, expires := "", "0"
	if cmd.AdditionalUnits > 0 {
		var err error
		if terms, err = pricedTerms("extend", cmd.Terms, cmd.AdditionalUnits); err != nil {
			return engine.MutationResult{}, err
		}
	}
	if !cmd.ExpiresAt.IsZero() {
		if !cmd.ExpiresAt.After(cmd.Now) {
			return engine.MutationResult{}, errors.New("lua: extend: expires_at is not after now")
		}
		expires = strconv.FormatInt(cmd.ExpiresAt.UnixMilli(), 10)
	}
	head, err := newHotHead(cmd.CommandHeader, cmd.Context)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := extendArgv{hotHead: head, ResID: cmd.ReservationID.String(), Units: strconv.FormatInt(cmd.AdditionalUnits, 10),
		Terms: terms, Expires: expires}
	res, err := s.runMoney(ctx, extendScript, "extend", s.reservationKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
	// The index record lives until the reservation's expiry: a prolonged reservation's
	// record is written again so a commit near the new expiry still
	// settles from Redis alone.
	return s.indexReservation(ctx, engine.ReserveCommand{CommandHeader: cmd.CommandHeader}, res, err)
}

// Gauge moves the gauge cmd.Metric by cmd.Delta (gauge.lua). An increment
// past cmd.Cap is refused unless cmd.Allow; a decrement never goes below
// zero. Errors: engine.GaugeCapError (current, cap, shortfall),
// ErrGaugeBelowZero, ErrOverflow, ErrIdempotencyMismatch, ErrStateMissing.
func (s *Store) Gauge(ctx context.Context, cmd engine.GaugeCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, cmd.CommandHeader, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.gauge(ctx, cmd) })
}

// gauge is Gauge once Postgres does not hold the key (appliedFirst).
func (s *Store) gauge(ctx context.Context, cmd engine.GaugeCommand) (engine.MutationResult, error) {
	if cmd.Metric == "" {
		return engine.MutationResult{}, errors.New("lua: gauge: no metric")
	}
	head, err := newHotHead(cmd.CommandHeader, cmd.Context)
	if err != nil {
		return engine.MutationResult{}, err
	}
	a := gaugeArgv{hotHead: head, Metric: cmd.Metric, Delta: strconv.FormatInt(cmd.Delta, 10),
		Cap: strconv.FormatInt(cmd.Cap, 10), Allow: flagText(cmd.Allow)}
	if cmd.LeaseID != uuid.Nil {
		a.LeaseID, a.LeaseSeconds = cmd.LeaseID.String(), strconv.FormatInt(cmd.LeaseSeconds, 10)
	}
	res, err := s.runMoney(ctx, gaugeScript, "gauge", s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
	return res, leaseError(err)
}

// GaugeValue reads c's counter of metric at the store's clock, 0 when never
// used, without the slots of leases past their expires (gauge_value.lua,
// read-only). Errors: engine.ErrStateMissing.
func (s *Store) GaugeValue(ctx context.Context, c engine.CustomerKey, metric string) (int64, error) {
	now := strconv.FormatInt(s.clock.Now().UnixMilli(), 10)
	key := s.accountKey(c.CustomerID)
	// Under a read door the stamps ride with the script (doRead): a gauge
	// check is one round trip too.
	cmd := redis.NewCmd(ctx, "evalsha", gaugeValueScript.Hash(), 1, key, metric, now)
	err := s.doRead(ctx, cmd)
	if isNoScript(err) {
		// Redis lost its scripts (a restart, a failover): this run loads it.
		cmd = gaugeValueScript.Run(ctx, s.rdb, []string{key}, metric, now)
		err = cmd.Err()
	}
	if errors.Is(err, engine.ErrFusedStale) {
		return 0, err
	}
	if err != nil {
		return 0, scriptError("gauge value", err)
	}
	v, err := cmd.Text()
	if err != nil {
		return 0, scriptError("gauge value", err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("lua: gauge value: %w", err)
	}
	return n, nil
}

// DueReservations lists up to limit (at most 10000) active reservations of
// partition p whose expires_at is at or before now, soonest first, from the
// partition's reservation-expiry zset.
func (s *Store) DueReservations(ctx context.Context, p int, now time.Time, limit int) ([]engine.DueReservation, error) {
	members, err := s.due(ctx, "due reservations", p, s.reservationExpiryKey(p), now, min(limit, maxDueReservations))
	if err != nil {
		return nil, err
	}
	out := make([]engine.DueReservation, 0, len(members))
	for _, m := range members {
		i := strings.LastIndexByte(m, '|')
		if i < 0 {
			return nil, fmt.Errorf("lua: due reservations: partition %d: bad member %q", p, m)
		}
		c, err := parseExpiryMember(m[:i])
		if err != nil {
			return nil, fmt.Errorf("lua: due reservations: partition %d: %w", p, err)
		}
		id, err := uuid.Parse(m[i+1:])
		if err != nil {
			return nil, fmt.Errorf("lua: due reservations: partition %d: bad member %q: %w", p, m, err)
		}
		out = append(out, engine.DueReservation{Customer: c, ReservationID: id})
	}
	return out, nil
}

// ReservationRef finds reservation id in the index Reserve writes (reservationRecord),
// or the customer alone in the record an older version wrote; ok is false
// when the index does not know it (never written, lost, or past its TTL),
// and the caller asks Postgres.
func (s *Store) ReservationRef(ctx context.Context, id uuid.UUID) (engine.ReservationRef, bool, error) {
	if rec, ok := s.refs.get(id, s.clock.Now()); ok {
		if ref, err := parseReservationRecord(rec); err == nil {
			return ref, true, nil
		}
	}
	v, err := s.rdb.MGet(ctx, s.reservationRecordKey(id), s.reservationIndexKey(id)).Result()
	if err != nil {
		return engine.ReservationRef{}, false, fmt.Errorf("lua: reservation reservation: %w", err)
	}
	if rec, ok := v[0].(string); ok {
		ref, err := parseReservationRecord(rec)
		if err != nil {
			return engine.ReservationRef{}, false, fmt.Errorf("lua: reservation hold %s: %w", id, err)
		}
		return ref, true, nil
	}
	old, ok := v[1].(string)
	if !ok {
		return engine.ReservationRef{}, false, nil
	}
	c, err := parseExpiryMember(old)
	if err != nil {
		return engine.ReservationRef{}, false, fmt.Errorf("lua: reservation customer %s: %w", id, err)
	}
	return engine.ReservationRef{Customer: c}, true, nil
}

// ReservationMetadata reads the stored metadata of reservation id of customer c from the
// customer's hash (nil when none); found is false when the hash does not
// hold the reservation.
func (s *Store) ReservationMetadata(ctx context.Context, c engine.CustomerKey, id uuid.UUID) (engine.Metadata, bool, error) {
	text, found, err := s.reservationMeta(ctx, c.CustomerID, id)
	if err != nil || !found || text == "" {
		return nil, found, err
	}
	var meta engine.Metadata
	if err := json.Unmarshal([]byte(text), &meta); err != nil {
		return nil, false, fmt.Errorf("lua: hold %s metadata: %w", id, err)
	}
	return meta, true, nil
}

// customerMember is c as "tenant|env|customer", the form of the expiry
// zset members.
func customerMember(c engine.CustomerKey) string {
	return c.TenantID.String() + "|" + string(c.Environment) + "|" + c.CustomerID.String()
}
