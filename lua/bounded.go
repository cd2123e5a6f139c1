package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Work the scripts leave to Go (invariant 13): matching stack_after against
// every block's metadata and merging a commit's metadata into its reservation's
// cost a script milliseconds in Lua at the largest metadata the API takes,
// so Go does both from a plain read and the script only checks that what
// Go read is still current (STALE otherwise, and Go reads again).

// staleRetries bounds how often a grant or commit re-reads after STALE.
const staleRetries = 5

// errStale is a script's STALE reply: the account changed since Go read it.
var errStale = errors.New("lua: the account changed since it was read")

// errStaleGaveUp is the answer when every retry found the account changed:
// other calls keep changing the customer; the caller may retry.
var errStaleGaveUp = engine.Conflict("the customer's credit changed during the call; retry")

// stackStart is where a stack_after block starts: the latest expires_at
// (ms) among the live blocks at now whose metadata matches, or ok false when
// none does; version is the account version it was read at.
// Under fallback "now" a customer already at engine.MaxLiveBlocks live
// blocks gets no match read at all (atCap): the script refuses such a
// grant (TOOMANYBLOCKS, or the accumulation cap's no-op) whatever the
// start, and the metadata of every block is the largest read of a grant.
func (s *Store) stackStart(ctx context.Context, c uuid.UUID, match engine.Metadata, fallback string, now time.Time) (start int64, ok bool, version int64, err error) {
	want := map[string]any{}
	for k, v := range match {
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return 0, false, 0, fmt.Errorf("lua: stack_after match %q: %w", k, err)
		}
		want[k] = x
	}
	key, nowMS := s.accountKey(c), now.UnixMilli()
	if start, ok, version, done, err := s.stackStartIndexed(ctx, key, want, fallback == engine.FallbackNow, nowMS); done || err != nil {
		return start, ok, version, err
	}
	// Sliced even when the layout cache does not know the key: a whole
	// HGETALL would also copy every reservation's metadata, which matching
	// never reads (a third of a stack_after grant's Redis work at the
	// worst allowed input, lua/profile_worst_test.go).
	a, err := s.readAccountSliced(ctx, key, true)
	if errors.Is(err, errAccountMoving) {
		a, err = s.readAccount(ctx, key)
	}
	if err != nil {
		return 0, false, 0, err
	}
	for _, b := range a.blocks {
		if b.ExpiresMS == nil || !b.Live(nowMS) || (ok && *b.ExpiresMS <= start) {
			continue
		}
		if blockMatches(b, want) {
			start, ok = *b.ExpiresMS, true
		}
	}
	return start, ok, a.version, nil
}

// blockMatches: block b's metadata holds want (a block whose metadata is
// not an object matches nothing, as in Lua).
func blockMatches(b engine.MutationBlock, want map[string]any) bool {
	have := map[string]any{}
	if len(b.Metadata) > 0 {
		if err := json.Unmarshal(b.Metadata, &have); err != nil {
			return false
		}
	}
	return metaMatches(have, want)
}

// stackStartIndexed is stackStart from the spend-order index (field "o",
// prelude/layout.lua) of an account that keeps one: the blocks with credit
// and their expiries without HKEYS (at the worst allowed input ~245k of a
// stack_after grant's ~1,400k instructions in Redis, lua/profile_worst_test.go),
// then the blocks that expire after now, latest first, in slices until the
// first match. done is false when the account has no index or moved
// between the reads: stackStart then reads it whole. With atCap (fallback
// "now") an index of engine.MaxLiveBlocks or more blocks live at now
// answers "no match" at once: grant.lua then refuses the grant at that
// version, whose live blocks are the index's (TOOMANYBLOCKS; the reply of
// the accumulation cap, checked first, does not depend on the start
// either), so reading 100 blocks' metadata for it was wasted (a
// refused grant at the worst allowed input: ~1 ms of Redis CPU).
func (s *Store) stackStartIndexed(ctx context.Context, key string, want map[string]any, atCap bool, nowMS int64) (start int64, ok bool, version int64, done bool, err error) {
	head, err := s.rdb.HMGet(ctx, key, "v", "o").Result()
	if err != nil {
		return 0, false, 0, false, fmt.Errorf("lua: read account: %w", err)
	}
	v, _ := head[0].(string)
	idx, _ := head[1].(string)
	if v == "" || idx == "" {
		return 0, false, 0, false, nil
	}
	if version, err = strconv.ParseInt(v, 10, 64); err != nil {
		return 0, false, 0, false, nil
	}
	type cand struct {
		id        string
		expiresMS int64
	}
	var cands []cand
	live := 0
	for _, e := range strings.Split(idx, " ") {
		// id,priority,expires,created,starts; expires "" for none.
		f := strings.SplitN(e, ",", 4)
		if len(f) < 4 {
			return 0, false, 0, false, nil
		}
		if f[2] == "" {
			live++
		} else if exp, err := strconv.ParseInt(f[2], 10, 64); err == nil && exp > nowMS {
			cands = append(cands, cand{f[0], exp})
			live++
		}
	}
	// The index holds every block with credit (prelude/layout.lua), so
	// these are the live blocks at now (engine.MutationBlock.Live).
	if atCap && live >= engine.MaxLiveBlocks {
		return 0, false, version, true, nil
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].expiresMS > cands[j].expiresMS })
	for first := 0; first < len(cands); first += sliceMetaFields {
		part := cands[first:min(first+sliceMetaFields, len(cands))]
		fields := make([]string, 0, 1+2*len(part))
		fields = append(fields, "v")
		for _, c := range part {
			fields = append(fields, "b:"+c.id, "m:"+c.id)
		}
		vals, err := s.rdb.HMGet(ctx, key, fields...).Result()
		if err != nil {
			return 0, false, 0, false, fmt.Errorf("lua: read account: %w", err)
		}
		if now, _ := vals[0].(string); now != v {
			return 0, false, 0, false, nil
		}
		for i, c := range part {
			raw, found := vals[1+2*i].(string)
			if !found {
				return 0, false, 0, false, nil
			}
			b, err := decodeBlock(c.id, raw)
			if err != nil || b.ExpiresMS == nil || *b.ExpiresMS != c.expiresMS {
				return 0, false, 0, false, nil
			}
			if meta, _ := vals[2+2*i].(string); meta != "" {
				b.Metadata = json.RawMessage(meta)
			}
			if b.Live(nowMS) && blockMatches(b, want) {
				return c.expiresMS, true, version, true, nil
			}
		}
	}
	return 0, false, version, true, nil
}

// metaMatches: have holds every key of want with an equal JSON value (as
// prelude/metadata.lua meta_matches compared cjson-decoded values: numbers as
// float64, and an empty object equal to an empty array).
func metaMatches(have, want map[string]any) bool {
	for k, v := range want {
		if !jsonEqual(have[k], v) {
			return false
		}
	}
	return true
}

func jsonEqual(x, y any) bool {
	if isEmptyContainer(x) && isEmptyContainer(y) {
		return true
	}
	return reflect.DeepEqual(x, y)
}

func isEmptyContainer(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		return len(t) == 0
	case []any:
		return len(t) == 0
	}
	return false
}

// reservationMeta is the stored metadata of reservation id ("" when none) and whether the
// reservation is in the hash at all.
func (s *Store) reservationMeta(ctx context.Context, c uuid.UUID, id uuid.UUID) (string, bool, error) {
	meta, _, found, err := s.reservationRead(ctx, c, id)
	return meta, found, err
}

// reservationRead is reservationMeta with the reservation's field "r:<id>"
// (raw) read in the same HMGET: a commit script checks that field to know
// the metadata is still what Go merged into (prelude/reservation_open.lua
// commit_meta) without reading the metadata again.
func (s *Store) reservationRead(ctx context.Context, c uuid.UUID, id uuid.UUID) (meta, raw string, found bool, err error) {
	v, err := s.rdb.HMGet(ctx, s.accountKey(c), "r:"+id.String(), "n:"+id.String()).Result()
	if err != nil {
		return "", "", false, fmt.Errorf("lua: read reservation: %w", err)
	}
	raw, found = v[0].(string)
	if !found {
		return "", "", false, nil
	}
	meta, _ = v[1].(string)
	return meta, raw, true, nil
}

// mergeMeta is stored with incoming's keys added or replaced (both JSON
// object text, "" when empty), as prelude/metadata.lua meta_merge: values keep their
// exact text.
func mergeMeta(stored, incoming string) (string, error) {
	if incoming == "" {
		return stored, nil
	}
	if stored == "" {
		return incoming, nil
	}
	var a, b map[string]json.RawMessage
	if err := json.Unmarshal([]byte(stored), &a); err != nil {
		return "", fmt.Errorf("lua: stored reservation metadata: %w", err)
	}
	if err := json.Unmarshal([]byte(incoming), &b); err != nil {
		return "", fmt.Errorf("lua: commit metadata: %w", err)
	}
	for k, v := range b {
		a[k] = v
	}
	out, err := json.Marshal(a)
	return string(out), err
}

// stackArgsOf are grant.lua's stack_start (the start Go found: ms, or
// "none") and stack_version (the version it read).
func stackArgsOf(start int64, ok bool, version int64) stackArgv {
	s := "none"
	if ok {
		s = strconv.FormatInt(start, 10)
	}
	return stackArgv{Start: s, Version: strconv.FormatInt(version, 10)}
}
