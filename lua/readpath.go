package lua

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// sourceNames undoes prelude/text.lua's one-letter source codes.
var sourceNames = map[string]engine.Source{
	"p": engine.SourcePlanGrant, "t": engine.SourceTopup, "o": engine.SourcePromotional,
	"c": engine.SourceCompensation, "r": engine.SourceReferral, "m": engine.SourceManual,
	"g": engine.SourceMigration,
}

// accountFields is an account hash read by Go: the read path of checks and
// balance snapshots is a plain HGETALL decoded here, not a script, because
// a script's Lua decoding costs Redis several times the HGETALL itself.
type accountFields struct {
	id             string
	version        int64
	reserved       int64
	lifetimeEarned int64
	updatedMS      int64
	// debt is what the account owes on its credit line (field "d").
	debt   int64
	blocks []engine.MutationBlock
	// reservationMetrics are the distinct metrics of the active reservations ("" for a
	// multi-metric one), read only from a hash holding a scoped block
	// (field "sc"): what engine.ScopeFree needs.
	reservationMetrics []string
	scoped             bool
}

// readAccount reads a customer's hash; engine.ErrStateMissing when absent.
// A small account is one HGETALL. An account known to keep the layout v2
// summary (a big one, up to megabytes of block and reservation metadata at the
// caps) is read in slices instead (readAccountSliced), so no single command
// holds Redis for every tenant while it copies the whole hash.
func (s *Store) readAccount(ctx context.Context, key string) (accountFields, error) {
	if s.layouts.has(key) {
		a, err := s.readAccountSliced(ctx, key, true)
		if !errors.Is(err, errAccountMoving) {
			return a, err
		}
	}
	read := redis.NewMapStringStringCmd(ctx, "hgetall", key)
	if err := s.doRead(ctx, read); err != nil {
		return accountFields{}, fmt.Errorf("lua: read account: %w", err)
	}
	raw := read.Val()
	if len(raw) == 0 {
		return accountFields{}, engine.ErrStateMissing
	}
	if _, ok := raw["s"]; ok {
		s.layouts.set(key, true)
	}
	return decodeAccount(raw)
}

// sliceMetaFields is how many block metadata fields one HMGET of a sliced
// read asks for: at the 4 KiB metadata limit, 64 KiB per command.
const sliceMetaFields = 16

// errAccountMoving: the account changed under a sliced read every time it
// was tried; the caller reads it whole.
var errAccountMoving = errors.New("lua: account changed during a sliced read")

// readAccountSliced reads the fields decodeAccount uses (never the reservations'
// metadata, and the blocks' only withMeta) with HKEYS and HMGETs of bounded size. Every HMGET also reads
// the version, and every script that changes a block or the reserved total
// moves it, so equal versions across the slices make one consistent
// snapshot; a read that saw the version move is tried again, twice.
func (s *Store) readAccountSliced(ctx context.Context, key string, withMeta bool) (accountFields, error) {
	for try := 0; try < 3; try++ {
		names, err := s.rdb.HKeys(ctx, key).Result()
		if err != nil {
			return accountFields{}, fmt.Errorf("lua: read account: %w", err)
		}
		if len(names) == 0 {
			return accountFields{}, engine.ErrStateMissing
		}
		head := []string{"v", "id", "rs", "le", "ua", "s", "d", "sc"}
		// The reservations only of a hash holding scoped blocks (their metrics:
		// accountFields.reservationMetrics).
		scoped := slices.Contains(names, "sc")
		var meta []string
		for _, n := range names {
			switch {
			case strings.HasPrefix(n, "b:"), scoped && strings.HasPrefix(n, "r:"):
				head = append(head, n)
			case withMeta && strings.HasPrefix(n, "m:"):
				meta = append(meta, n)
			}
		}
		raw := make(map[string]string, len(head)+len(meta))
		version, moved := "", false
		read := func(fields []string) error {
			vals, err := s.rdb.HMGet(ctx, key, fields...).Result()
			if err != nil {
				return fmt.Errorf("lua: read account: %w", err)
			}
			for i, v := range vals {
				if str, ok := v.(string); ok {
					raw[fields[i]] = str
				}
			}
			v, _ := vals[0].(string)
			if version == "" {
				version = v
			} else if v != version {
				moved = true
			}
			return nil
		}
		if err := read(head); err != nil {
			return accountFields{}, err
		}
		for first := 0; first < len(meta) && !moved; first += sliceMetaFields {
			fields := append([]string{"v"}, meta[first:min(first+sliceMetaFields, len(meta))]...)
			if err := read(fields); err != nil {
				return accountFields{}, err
			}
		}
		if version == "" {
			return accountFields{}, engine.ErrStateMissing
		}
		if moved {
			continue
		}
		if _, ok := raw["s"]; !ok {
			s.layouts.set(key, false)
		}
		return decodeAccount(raw)
	}
	return accountFields{}, errAccountMoving
}

// decodeAccount reads the fields prelude/account_commit.lua's acct_commit writes.
func decodeAccount(raw map[string]string) (accountFields, error) {
	var a accountFields
	var err error
	// stored: each block's id as its field names hold it (compact), to
	// find its metadata field.
	var stored []string
	for f, v := range raw {
		switch {
		case strings.HasPrefix(f, "m:"):
			// Block metadata (prelude/blocks.lua): joined to its block below.
		case strings.HasPrefix(f, "b:"):
			b, berr := decodeBlock(f[2:], v)
			if berr != nil {
				return accountFields{}, berr
			}
			a.blocks = append(a.blocks, b)
			stored = append(stored, f[2:])
		case f == "id":
			// Opaque text to the scripts: "" before the account exists, the
			// compact form of a UUID (load.go compactText).
			a.id = engine.StoredIDText(v)
		case f == "v":
			a.version, err = strconv.ParseInt(v, 10, 64)
		case f == "rs":
			a.reserved, err = strconv.ParseInt(v, 10, 64)
		case f == "le":
			a.lifetimeEarned, err = strconv.ParseInt(v, 10, 64)
		case f == "d":
			a.debt, err = strconv.ParseInt(v, 10, 64)
		case f == "ua":
			a.updatedMS, err = strconv.ParseInt(v, 10, 64)
		}
		if err != nil {
			return accountFields{}, fmt.Errorf("lua: account field %s: %w", f, err)
		}
	}
	for i := range a.blocks {
		b := &a.blocks[i]
		if meta, ok := raw["m:"+stored[i]]; ok && meta != "" {
			b.Metadata = json.RawMessage(meta)
		}
	}
	if _, ok := raw["sc"]; ok {
		a.scoped, a.reservationMetrics = true, activeReservationMetrics(raw)
	}
	return a, nil
}

// activeReservationMetrics are the distinct metrics of the active reservations of hash
// raw (prelude/reservations.lua res_enc: status "a", metric the tenth field), sorted.
func activeReservationMetrics(raw map[string]string) []string {
	seen := map[string]bool{}
	out := []string{}
	for f, v := range raw {
		if !strings.HasPrefix(f, "r:") || !strings.HasPrefix(v, "a|") {
			continue
		}
		if p := strings.SplitN(v, "|", 11); len(p) == 11 && !seen[p[9]] {
			seen[p[9]] = true
			out = append(out, p[9])
		}
	}
	slices.Sort(out)
	return out
}

// decodeBlock reads block_enc's "rem|orig|prio|created36|starts-created36|
// expires-starts36|source" (orig "" while it equals rem), then "|@keys"
// for a scoped block (prelude/blocks.lua). id is the field name's, in the
// compact form (engine.ParseCompactID): no hash of an older layout is left
// once a node of this release serves (layout_fence.go).
func decodeBlock(id, raw string) (engine.MutationBlock, error) {
	p := strings.SplitN(raw, "|", 8)
	if len(p) != 7 && (len(p) != 8 || !strings.HasPrefix(p[7], "@")) {
		return engine.MutationBlock{}, fmt.Errorf("lua: block %s: malformed", id)
	}
	var b engine.MutationBlock
	var err error
	if b.ID, err = engine.ParseCompactID(id); err != nil {
		return b, fmt.Errorf("lua: block id %q: %w", id, err)
	}
	if b.Remaining, err = strconv.ParseInt(p[0], 10, 64); err != nil {
		return b, fmt.Errorf("lua: block %s remaining: %w", id, err)
	}
	b.Original = b.Remaining
	if p[1] != "" {
		if b.Original, err = strconv.ParseInt(p[1], 10, 64); err != nil {
			return b, fmt.Errorf("lua: block %s original: %w", id, err)
		}
	}
	prio, err := strconv.Atoi(p[2])
	if err != nil {
		return b, fmt.Errorf("lua: block %s priority: %w", id, err)
	}
	b.Priority = prio
	if b.CreatedMS, err = strconv.ParseInt(p[3], 36, 64); err != nil {
		return b, fmt.Errorf("lua: block %s created: %w", id, err)
	}
	b.StartsMS = b.CreatedMS
	if p[4] != "" {
		off, err := strconv.ParseInt(p[4], 36, 64)
		if err != nil {
			return b, fmt.Errorf("lua: block %s starts: %w", id, err)
		}
		b.StartsMS += off
	}
	if p[5] != "" {
		off, err := strconv.ParseInt(p[5], 36, 64)
		if err != nil {
			return b, fmt.Errorf("lua: block %s expires: %w", id, err)
		}
		exp := b.StartsMS + off
		b.ExpiresMS = &exp
	}
	if name, ok := sourceNames[p[6]]; ok {
		b.Source = name
	} else {
		b.Source = engine.Source(p[6])
	}
	if len(p) == 8 {
		// The block's scope (prelude/blocks.lua block_dec).
		b.Scope = strings.Split(p[7][1:], ",")
	}
	return b, nil
}

// Balances is a check's lean read of c's account: one HGETALL (pipelined
// with concurrent requests' commands, coalescer) of which only
// the reserved total and each block's remaining, starts and expires are
// parsed (no block ids, sources, metadata or reservations decoded, nothing
// sorted). Figures match Snapshot's. Errors: engine.ErrStateMissing.
//
// An account known to keep the layout v2 summary (field "s", prelude/layout.lua)
// is read by one HMGET of the summary instead: a big account's HGETALL
// copies every block's and reservation's metadata (megabytes at the caps). The
// summary answers only inside its window; outside it the HGETALL does.
func (s *Store) Balances(ctx context.Context, c engine.CustomerKey, now time.Time) (engine.Balances, error) {
	key, nowMS := s.accountKey(c.CustomerID), now.UnixMilli()
	if s.layouts.has(key) {
		cmd := redis.NewSliceCmd(ctx, "hmget", key, "s", "rs", "ua", "d", "sc")
		if err := s.doRead(ctx, cmd); err != nil {
			return engine.Balances{}, fmt.Errorf("lua: read account: %w", err)
		}
		v := cmd.Val()
		sum, _ := v[0].(string)
		rs, _ := v[1].(string)
		ua, _ := v[2].(string)
		d, _ := v[3].(string)
		debt, derr := strconv.ParseInt(cmp.Or(d, "0"), 10, 64)
		if derr != nil {
			return engine.Balances{}, fmt.Errorf("lua: account field d: %w", derr)
		}
		if sum == "" {
			s.layouts.set(key, false)
		} else if b, ok := summaryBalances(sum, rs, ua, nowMS); ok {
			b.Scoped = v[4] != nil
			return b.WithDebt(debt), nil
		} else if a, err := s.readAccountSliced(ctx, key, false); !errors.Is(err, errAccountMoving) {
			// Outside the summary's window: the blocks, in slices, without
			// their metadata (megabytes at the caps).
			if err != nil {
				return engine.Balances{}, err
			}
			b := engine.ComputeBalances(a.blocks, a.reserved, nowMS).WithDebt(a.debt)
			b.Scoped = a.scoped
			return b, nil
		}
	}
	read := redis.NewMapStringStringCmd(ctx, "hgetall", key)
	err := s.doRead(ctx, read)
	if err != nil {
		return engine.Balances{}, fmt.Errorf("lua: read account: %w", err)
	}
	raw := read.Val()
	if len(raw) == 0 {
		return engine.Balances{}, engine.ErrStateMissing
	}
	if _, ok := raw["s"]; ok {
		s.layouts.set(key, true)
	}
	return balancesOf(raw, nowMS)
}

// summaryBalances are the figures of the layout v2 summary sum
// ("balance|pending|live|active|E|S|F", prelude/layout.lua) with the reserved
// total rs, when the summary written at ua holds at nowMS: F <= nowMS <
// min(E, S) and ua < E (no block expired or started since). ok is false
// outside that window or for a summary it cannot read.
func summaryBalances(sum, rs, ua string, nowMS int64) (b engine.Balances, ok bool) {
	p := strings.Split(sum, "|")
	if len(p) != 7 {
		return b, false
	}
	at := func(s string) (int64, bool, bool) { // value, present, well formed
		if s == "" {
			return 0, false, true
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, true, err == nil
	}
	e, hasE, okE := at(p[4])
	st, hasS, okS := at(p[5])
	f, hasF, okF := at(p[6])
	u, _, okU := at(ua)
	reserved, _, okR := at(rs)
	if !okE || !okS || !okF || !okU || !okR || (hasF && f > nowMS) || (hasE && (nowMS >= e || u >= e)) || (hasS && nowMS >= st) {
		return b, false
	}
	bal, err1 := strconv.ParseInt(p[0], 10, 64)
	pend, err2 := strconv.ParseInt(p[1], 10, 64)
	if err1 != nil || err2 != nil {
		return b, false
	}
	return engine.Balances{Balance: bal, Reserved: reserved, Pending: pend, Effective: bal - reserved - pend}, true
}

// maxLayoutKeys bounds layoutSet: past it the set starts over (a key
// forgotten only costs its next check one HGETALL).
const maxLayoutKeys = 1 << 16

// layoutSet is a bounded set of account keys.
type layoutSet struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

// has reports whether key is in the set.
func (l *layoutSet) has(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.keys[key]
	return ok
}

// set adds key (on) or removes it.
func (l *layoutSet) set(key string, on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !on {
		delete(l.keys, key)
		return
	}
	if l.keys == nil || len(l.keys) >= maxLayoutKeys {
		l.keys = make(map[string]struct{})
	}
	l.keys[key] = struct{}{}
}

// balancesOf sums the live blocks of an account hash at nowMS the way
// engine.ComputeBalances does.
func balancesOf(raw map[string]string, nowMS int64) (engine.Balances, error) {
	var out engine.Balances
	var debt int64
	for f, v := range raw {
		switch {
		case len(f) > 2 && f[0] == 'b' && f[1] == ':':
			rem, starts, expires, hasExpiry, err := blockFigures(v)
			if err != nil {
				return engine.Balances{}, fmt.Errorf("lua: block %s: %w", f[2:], err)
			}
			if rem <= 0 || (hasExpiry && expires <= nowMS) {
				continue
			}
			out.Balance += rem
			if starts > nowMS {
				out.Pending += rem
			}
		case f == "rs":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return engine.Balances{}, fmt.Errorf("lua: account field rs: %w", err)
			}
			out.Reserved = n
		case f == "d":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return engine.Balances{}, fmt.Errorf("lua: account field d: %w", err)
			}
			debt = n
		case f == "sc":
			out.Scoped = true
		}
	}
	out.Effective = out.Balance - out.Reserved - out.Pending
	return out.WithDebt(debt), nil
}

// blockFigures reads remaining, starts and expires (ms) out of block_enc's
// "rem|orig|prio|created36|starts-created36|expires-starts36|..." without
// splitting the rest.
func blockFigures(v string) (rem, starts, expires int64, hasExpiry bool, err error) {
	var p [6]string
	for i := 0; i < 6; i++ {
		j := strings.IndexByte(v, '|')
		if j < 0 {
			return 0, 0, 0, false, errMalformedBlock
		}
		p[i], v = v[:j], v[j+1:]
	}
	if rem, err = strconv.ParseInt(p[0], 10, 64); err != nil {
		return 0, 0, 0, false, err
	}
	if starts, err = strconv.ParseInt(p[3], 36, 64); err != nil {
		return 0, 0, 0, false, err
	}
	if p[4] != "" {
		off, err := strconv.ParseInt(p[4], 36, 64)
		if err != nil {
			return 0, 0, 0, false, err
		}
		starts += off
	}
	if p[5] != "" {
		off, err := strconv.ParseInt(p[5], 36, 64)
		if err != nil {
			return 0, 0, 0, false, err
		}
		expires, hasExpiry = starts+off, true
	}
	return rem, starts, expires, hasExpiry, nil
}

var errMalformedBlock = errors.New("malformed")

// hexUUID writes u's canonical 36-character form into dst.
func hexUUID(dst []byte, u uuid.UUID) {
	const digits = "0123456789abcdef"
	j := 0
	for i, x := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = digits[x>>4], digits[x&0xf]
		j += 2
	}
}

// BudgetCounters reads budget counter fields of c's account hash
// (prelude/budgets.lua budget_take): "" for a missing one; ErrStateMissing when
// the hash is missing. One HMGET, with the version to tell a missing hash.
func (s *Store) BudgetCounters(ctx context.Context, c engine.CustomerKey, fields []string) ([]string, error) {
	vals, err := s.rdb.HMGet(ctx, s.accountKey(c.CustomerID), append([]string{"v"}, fields...)...).Result()
	if err != nil {
		return nil, fmt.Errorf("lua: read budgets: %w", s.unavail.classify(err))
	}
	if vals[0] == nil {
		return nil, engine.ErrStateMissing
	}
	out := make([]string, len(fields))
	for i, v := range vals[1:] {
		out[i], _ = v.(string)
	}
	return out, nil
}

var _ engine.BudgetCounterReader = (*Store)(nil)
