package lua

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Go side of load.lua: a rebuild writes each account hash in the encoding
// the prelude reads (the header comments of prelude/blocks.lua and
// prelude/reservations.lua; blockValue and reservationValue mirror block_enc and
// res_enc, and TestLoadEncodingMatchesPrelude keeps them equal), so Redis
// only fences and writes.

// sourceCodes are prelude/text.lua's one-letter source codes (SOURCE_CODE).
var sourceCodes = func() map[engine.Source]string {
	m := make(map[engine.Source]string, len(sourceNames))
	for code, name := range sourceNames {
		m[name] = code
	}
	return m
}()

// reservationCodes are prelude/reservations.lua's one-letter reservation statuses (RES_CODE).
var reservationCodes = map[engine.ReservationStatus]string{
	engine.ReservationActive: "a", engine.ReservationCommitted: "c",
	engine.ReservationReleased: "r", engine.ReservationExpired: "e",
}

func b36(n int64) string { return strconv.FormatInt(n, 36) }

func dec(n int64) string { return strconv.FormatInt(n, 10) }

// blockValue is field "b:<id>" of block b (prelude/blocks.lua block_enc): its
// metadata lives in field "m:<id>"; the original amount is left out while
// it equals the remaining one; a scope is an eighth field "@k1,k2".
func blockValue(b engine.MutationBlock) string {
	st, exp, orig := "", "", ""
	if b.Original != b.Remaining {
		orig = dec(b.Original)
	}
	if b.StartsMS != b.CreatedMS {
		st = b36(b.StartsMS - b.CreatedMS)
	}
	if b.ExpiresMS != nil {
		exp = b36(*b.ExpiresMS - b.StartsMS)
	}
	src, ok := sourceCodes[b.Source]
	if !ok {
		src = string(b.Source)
	}
	scope := ""
	if len(b.Scope) > 0 {
		scope = "|@" + engine.ScopeText(b.Scope)
	}
	return dec(b.Remaining) + "|" + orig + "|" + strconv.Itoa(b.Priority) + "|" + b36(b.CreatedMS) +
		"|" + st + "|" + exp + "|" + src + scope
}

// reservationValue is field "r:<id>" of reservation r (prelude/reservations.lua res_enc); final is
// when it was finalized, nil while active. Its metadata lives in field
// "n:<id>".
func reservationValue(r engine.MutationReservation, final *int64) string {
	opt := func(v *int64, enc func(int64) string) string {
		if v == nil {
			return ""
		}
		return enc(*v)
	}
	return reservationCodes[r.Status] + "|" + dec(r.EstimatedUnits) + "|" + dec(r.EstimatedCost) + "|" + b36(r.ExpiresMS) +
		"|" + b36(r.CreatedMS) + "|" + opt(final, b36) + "|" + opt(r.ActualUnits, dec) + "|" + opt(r.ActualCost, dec) +
		"|" + dec(r.Released) + "|" + r.Metric + "|"
}

// loadCall is one load.lua call: accounts of one partition.
type loadCall struct {
	index []int // the states' positions in the LoadBatch argument
	keys  []string
	args  []any // without the leading account count
	n     int
	tag   string // the partition's key tag, s.tag(p)
	cmd   *redis.Cmd
}

// argv is the call's ARGV: the account count, then each account's values.
func (c *loadCall) argv() []any {
	return append([]any{strconv.Itoa(c.n)}, c.args...)
}

// loadArgs appends st's KEYS and ARGV to c in load.lua's layout; the first
// account also brings the partition's two zsets. st.Applied writes no op
// key (Postgres answers their retries); reservations finalized reservationKeep or
// more before now are left out (the scripts would drop them at once).
func (s *Store) loadArgs(c *loadCall, st engine.AccountState, now time.Time) error {
	return s.loadArgsExpecting(c, st, now, "")
}

// loadArgsExpecting is loadArgs with load.lua's expected version: "" for
// the version fence, else the decimal version the hash must still hold
// (-1: absent) to be replaced (a reconcile's reload).
func (s *Store) loadArgsExpecting(c *loadCall, st engine.AccountState, now time.Time, expect string) error {
	cust := st.CustomerID
	if c.n == 0 {
		p := Partition(cust)
		c.tag = s.tag(p)
		c.keys = append(c.keys, s.reservationExpiryKey(p))
	}
	nowMS := now.UnixMilli()
	// Every account of a call is of its partition (LoadBatch groups them).
	cs, tenant := cust.String(), st.TenantID.String()
	member := tenant + "|" + string(st.Environment) + "|" + cs

	// No tenant or environment field: the scripts take both as arguments
	// and nothing reads them from the hash (issue 10: ~46 bytes a customer).
	fields := []any{"v", dec(st.Version), "id", storedAccountID(st.AccountID),
		"le", dec(st.LifetimeEarned), "ua", dec(st.UpdatedAtMS)}
	// The reserved total only when it is not zero, as acct_commit keeps it
	// (a missing "rs" reads as zero).
	if st.Reserved != 0 {
		fields = append(fields, "rs", dec(st.Reserved))
	}
	// The debt of the credit line likewise (a missing "d" reads as zero).
	if st.Debt != 0 {
		fields = append(fields, "d", dec(st.Debt))
	}
	// The budget counters that counted something (a missing one reads as
	// zero spent; prelude/budgets.lua budget_take).
	budgets := make([]string, 0, len(st.Budgets))
	for f, c := range st.Budgets {
		if c.SpentMC != 0 {
			budgets = append(budgets, f)
		}
	}
	sort.Strings(budgets)
	for _, f := range budgets {
		fields = append(fields, f, st.Budgets[f].String())
	}
	var kept []keptReservation
	var stored []engine.MutationBlock
	active := 0
	for _, b := range st.Blocks {
		if err := checkSource(b.Source); err != nil {
			return fmt.Errorf("lua: load: block %s: %w", b.ID, err)
		}
		meta, err := compactMeta(b.Metadata)
		if err != nil {
			return fmt.Errorf("lua: load: block %s: %w", b.ID, err)
		}
		if b.Remaining <= 0 {
			continue // emptied blocks live in Postgres only
		}
		id := engine.CompactID(b.ID)
		stored = append(stored, b)
		fields = append(fields, "b:"+id, blockValue(b))
		if meta != "" {
			fields = append(fields, "m:"+id, meta)
		}
	}
	var reservationZ []any
	for _, r := range st.Reservations {
		if _, ok := reservationCodes[r.Status]; !ok {
			return fmt.Errorf("lua: load: reservation %s: status %q", r.ID, r.Status)
		}
		// A multi-metric reservation has no metric (reserve_multi.lua): its items
		// stay in Postgres, which a commit reads.
		if err := checkMetric(r.Metric); err != nil && r.Metric != "" {
			return fmt.Errorf("lua: load: reservation %s: %w", r.ID, err)
		}
		var final *int64
		switch {
		case r.Status == engine.ReservationActive:
		case r.Status == engine.ReservationCommitted && r.CommittedMS != nil:
			final = r.CommittedMS
		case r.Status != engine.ReservationCommitted && r.ReleasedMS != nil:
			final = r.ReleasedMS
		default:
			return fmt.Errorf("lua: load: reservation %s: %s without its instant", r.ID, r.Status)
		}
		if final != nil && *final+reservationKeep.Milliseconds() <= nowMS {
			continue
		}
		meta, err := compactMeta(r.Metadata)
		if err != nil {
			return fmt.Errorf("lua: load: reservation %s: %w", r.ID, err)
		}
		id := r.ID.String()
		fields = append(fields, "r:"+id, reservationValue(r, final))
		if meta != "" {
			fields = append(fields, "n:"+id, meta)
		}
		if r.Status == engine.ReservationActive {
			reservationZ = append(reservationZ, dec(r.ExpiresMS), member+"|"+id)
			active++
		} else {
			kept = append(kept, keptReservation{id, *final})
		}
	}
	for metric, n := range st.Gauges {
		if metric == "" {
			return fmt.Errorf("lua: load: gauge without a metric")
		}
		fields = append(fields, "g:"+metric, dec(n))
	}
	lf, err := leaseFields(st.Leases)
	if err != nil {
		return err
	}
	fields = append(fields, lf...)

	fields = append(fields, layoutFields(stored, active, kept, st.UpdatedAtMS)...)
	// "sc" counts the scoped blocks, as acct_commit writes it (absent: none).
	nsc := 0
	for _, b := range stored {
		if len(b.Scope) > 0 {
			nsc++
		}
	}
	if nsc > 0 {
		fields = append(fields, "sc", strconv.Itoa(nsc))
	}

	c.keys = append(c.keys, c.tag+":a:"+cs) // s.accountKey(cust)
	// No op keys: st.Applied is in Postgres, which answers a retry of any of
	// them (appliedFirst), so a rebuild writes none (issue 10: an op key
	// lives only until its operation is committed).
	var ops []any

	c.args = append(c.args, dec(st.Version), strconv.Itoa(len(ops)/2), strconv.Itoa(len(fields)/2),
		strconv.Itoa(len(reservationZ)/2), expect)
	c.args = append(c.args, reservationZ...)
	c.args = append(c.args, fields...)
	c.args = append(c.args, ops...)
	c.n++
	return nil
}

// storedAccountID is the account id as the hash keeps it: compact
// (engine.CompactID) when it is a UUID, as grant.lua is handed it.
func storedAccountID(id string) string {
	u, err := uuid.Parse(id)
	if err != nil {
		return id
	}
	return engine.CompactID(u)
}

// layoutMinItems is prelude/layout.lua's LAYOUT_MIN_ITEMS: an account of fewer
// blocks and active reservations goes without the layout v2 fields.
const layoutMinItems = 8

// keptReservation is a finalized reservation kept in the hash: its id and when it was
// finalized (ms).
type keptReservation struct {
	id    string
	final int64
}

// layoutFields are the layout v2 fields "s", "o" and "k" (prelude/layout.lua,
// "Account layout v2") of an account hash holding blocks (all with credit),
// active reservations and the kept finalized reservations, last written at u (field
// "ua"): byte for byte what acct_commit writes, so a rebuilt hash takes the
// scripts' fast path at once and equals the hash it replaces.
func layoutFields(blocks []engine.MutationBlock, active int, kept []keptReservation, u int64) []any {
	if len(blocks)+active < layoutMinItems {
		return nil
	}
	var bal, pend int64
	var nlive int
	var e, st, f *int64
	opt := func(v *int64) string {
		if v == nil {
			return ""
		}
		return dec(*v)
	}
	for _, b := range blocks {
		if b.Live(u) {
			nlive++
			bal += b.Remaining
			if !b.Started(u) {
				pend += b.Remaining
			}
		}
		if b.ExpiresMS != nil && (e == nil || *b.ExpiresMS < *e) {
			e = b.ExpiresMS
		}
		starts := b.StartsMS
		if starts > u {
			if st == nil || starts < *st {
				st = &starts
			}
		} else if f == nil || starts > *f {
			f = &starts
		}
	}
	order := append([]engine.MutationBlock(nil), blocks...)
	engine.SpendOrder(order)
	idx := make([]string, len(order))
	for i, b := range order {
		idx[i] = engine.CompactID(b.ID) + "," + strconv.Itoa(b.Priority) + "," + opt(b.ExpiresMS) + "," + dec(b.CreatedMS) + "," + dec(b.StartsMS)
	}
	sort.Slice(kept, func(i, j int) bool {
		if kept[i].final != kept[j].final {
			return kept[i].final < kept[j].final
		}
		return kept[i].id < kept[j].id
	})
	ks := make([]string, len(kept))
	for i, k := range kept {
		ks[i] = k.id + "," + dec(k.final)
	}
	sum := dec(bal) + "|" + dec(pend) + "|" + strconv.Itoa(nlive) + "|" + strconv.Itoa(active) + "|" + opt(e) + "|" + opt(st) + "|" + opt(f)
	return []any{"o", strings.Join(idx, " "), "k", strings.Join(ks, " "), "s", sum}
}
