package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// The account hash layouts before issue 10's compact one (UUID text ids,
// "rs" "0", originals always written, metadata inline) are no longer read
// by any script or Go reader of this release (issue 29). A node crosses
// into serving only once every partition carries the layout marker, which
// RewriteLayouts sets after it has rewritten every account hash of an
// older layout (layoutPlan, written by layout_rewrite.lua); serve runs it before it listens, so
// the first node of this release does the work and the others find the
// markers. It is safe beside nodes of the release before (v0.3.0): they
// write the current layout and keep an older hash's layout only as they
// read it, so once rewritten a hash stays current (docs/decisions.md
// "Legacy account layouts rewritten once (issue 29)").

var (
	//go:embed layout_rewrite.lua
	layoutRewriteLua    string
	layoutRewriteScript = redis.NewScript(layoutRewriteLua)
)

// layoutGeneration is the account layout this build reads, kept in every
// partition's marker once its hashes are in it. A later change of layout
// that needs a rewrite gives it a new value.
const layoutGeneration = "compact-1"

// layoutScanCount is SCAN's COUNT and the rewrite's pipeline depth: a
// batch of account hashes rewritten in one round trip.
const layoutScanCount = 500

// layoutMarkerKey is partition p's layout marker: in the partition's slot,
// so a shard restored from a backup taken before the rewrite comes back
// without its partitions' markers and is rewritten again.
func (s *Store) layoutMarkerKey(p int) string { return s.tag(p) + ":layout" }

// LayoutsPending is the partitions whose layout marker is not this build's
// (none once RewriteLayouts has run on this Redis).
func (s *Store) LayoutsPending(ctx context.Context) ([]int, error) {
	cmds := make([]*redis.StringCmd, Partitions)
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = p.Get(ctx, s.layoutMarkerKey(i))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("lua: read the layout markers: %w", err)
	}
	var pending []int
	for i, c := range cmds {
		if v, err := c.Result(); err != nil || v != layoutGeneration {
			pending = append(pending, i)
		}
	}
	return pending, nil
}

// LayoutRewrite is what RewriteLayouts did.
type LayoutRewrite struct {
	Scanned   int           // account hashes found
	Rewritten int           // of them, those in an older layout
	Took      time.Duration // the whole pass, markers included
}

// RewriteLayouts rewrites every account hash of an older layout into the
// current one (layoutPlan, written by layout_rewrite.lua: atomic per hash
// and idempotent) and then sets every partition's layout marker. With
// every marker already set it does nothing. It scans each master once (every partition's account
// keys), so on a Cluster it covers every slot; safe to run from several
// nodes at once and beside running traffic. Errors: Redis's; the markers
// are then left unset, and the next run scans again.
func (s *Store) RewriteLayouts(ctx context.Context) (LayoutRewrite, error) {
	start := time.Now()
	var out LayoutRewrite
	pending, err := s.LayoutsPending(ctx)
	if err != nil || len(pending) == 0 {
		return out, err
	}
	if err := layoutRewriteScript.Load(ctx, s.rdb).Err(); err != nil {
		return out, fmt.Errorf("lua: load layout_rewrite.lua: %w", err)
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		// ForEachMaster runs the masters at once: each adds its figures.
		var mu sync.Mutex
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			r, err := s.rewriteNode(ctx, c)
			mu.Lock()
			out.Scanned, out.Rewritten = out.Scanned+r.Scanned, out.Rewritten+r.Rewritten
			mu.Unlock()
			return err
		})
	} else {
		out, err = s.rewriteNode(ctx, s.rdb)
	}
	if err != nil {
		return out, err
	}
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := 0; i < Partitions; i++ {
			p.Set(ctx, s.layoutMarkerKey(i), layoutGeneration, 0)
		}
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("lua: set the layout markers: %w", err)
	}
	out.Took = time.Since(start)
	return out, nil
}

// rewriteNode scans node (a single Redis, or one Cluster master) for this
// Store's account hashes and rewrites each batch in one pipeline, sent
// through the Store's client so a key whose slot moved meanwhile still
// reaches its master.
func (s *Store) rewriteNode(ctx context.Context, node redis.Cmdable) (LayoutRewrite, error) {
	var out LayoutRewrite
	match := globEscape("{"+s.prefix+":p") + "[0-9][0-9]}:a:*"
	var cursor uint64
	for {
		keys, next, err := node.ScanType(ctx, cursor, match, layoutScanCount, "hash").Result()
		if err != nil {
			return out, fmt.Errorf("lua: scan the account hashes: %w", err)
		}
		n, err := s.rewriteBatch(ctx, keys)
		out.Scanned, out.Rewritten = out.Scanned+len(keys), out.Rewritten+n
		if err != nil {
			return out, err
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// layoutRewriteAttempts bounds how often one batch is read again because
// a hash in it changed between the read and its rewrite (a money call on
// it meanwhile): each attempt rewrites every hash that held still.
const layoutRewriteAttempts = 8

// rewriteBatch rewrites each of keys that is in an older layout and counts
// them: one pipeline of HGETALLs, then one of layout_rewrite.lua calls
// (layoutPlan's change, written only when the fields it came from are
// unchanged), sent through the Store's client. A hash that changed
// meanwhile is read again. A master that lost the script (a failover,
// SCRIPT FLUSH) gets it again: the rewrite is idempotent.
func (s *Store) rewriteBatch(ctx context.Context, keys []string) (int, error) {
	n := 0
	for attempt := 0; len(keys) > 0; attempt++ {
		if attempt == layoutRewriteAttempts {
			return n, fmt.Errorf("lua: account hash %s kept changing during its layout rewrite", keys[0])
		}
		reads := make([]*redis.MapStringStringCmd, len(keys))
		if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				reads[i] = p.HGetAll(ctx, k)
			}
			return nil
		}); err != nil {
			return n, fmt.Errorf("lua: read account hashes: %w", err)
		}
		// stale: the keys still in an old layout, with their rewrite arguments.
		var stale []string
		var args [][]any
		for i, k := range keys {
			check, del, set, err := layoutPlan(reads[i].Val())
			if err != nil {
				return n, fmt.Errorf("lua: account hash %s: %w", k, err)
			}
			if len(check) == 0 && len(del) == 0 && len(set) == 0 {
				continue
			}
			a := make([]any, 0, 2+len(check)+len(del)+len(set))
			a = append(a, len(check)/2)
			for _, x := range check {
				a = append(a, x)
			}
			a = append(a, len(del))
			for _, x := range del {
				a = append(a, x)
			}
			for _, x := range set {
				a = append(a, x)
			}
			stale, args = append(stale, k), append(args, a)
		}
		if len(stale) == 0 {
			return n, nil
		}
		cmds := make([]*redis.Cmd, len(stale))
		_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range stale {
				cmds[i] = layoutRewriteScript.EvalSha(ctx, p, []string{k}, args[i]...)
			}
			return nil
		})
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err := layoutRewriteScript.Load(ctx, s.rdb).Err(); err != nil {
				return n, fmt.Errorf("lua: load layout_rewrite.lua: %w", err)
			}
			continue
		}
		if err != nil {
			return n, fmt.Errorf("lua: rewrite account layouts: %w", err)
		}
		var again []string
		for i, c := range cmds {
			if v, _ := c.Int(); v == 1 {
				n++
			} else {
				again = append(again, stale[i])
			}
		}
		keys = again
	}
	return n, nil
}

// layoutPlan is the rewrite of account hash h into the current layout
// (prelude/blocks.lua, prelude/reservations.lua): the fields it comes
// from as field, value pairs (check), the fields to delete and the field,
// value pairs to set; all empty when h is current. What an older hash
// holds and becomes:
//   - ids as UUID text (field "id", block fields "b:<id>" and "m:<id>"):
//     engine.CompactID's form; the layout v2 fields "s", "o" and "k" are
//     then deleted (the index names block ids, its ties ordered on the old
//     spelling), so the next money script reads the hash whole and writes
//     them again (prelude/layout.lua);
//   - "rs" "0": deleted (a missing "rs" reads as zero);
//   - a block's original written out while equal to its remaining: "";
//   - a block's eighth field "|" or "|<metadata>": dropped, the metadata
//     moved to "m:<id>" (inline metadata wins over that field: the readers
//     before issue 29 returned it); "|@<keys>", a scope, stays;
//   - a reservation's metadata after its tenth "|": moved to "n:<id>".
//
// Reservations, gauges, leases, budgets and draw counters keep their
// fields: their layout never changed. Errors: a block or reservation value
// it cannot parse.
func layoutPlan(h map[string]string) (check, del, set []string, err error) {
	names := slices.Sorted(maps.Keys(h))
	from := func(f string) { check = append(check, f, h[f]) }
	inline := map[string]bool{}
	idsMoved := false
	for _, f := range names {
		v := h[f]
		switch {
		case f == "id":
			if c, ok := compactOf(v); ok {
				from(f)
				set = append(set, f, c)
			}
		case f == "rs":
			if v == "0" {
				from(f)
				del = append(del, f)
			}
		case strings.HasPrefix(f, "b:"):
			id, cid := f[2:], f[2:]
			c, moved := compactOf(id)
			if moved {
				cid = c
			}
			p := strings.SplitN(v, "|", 8)
			if len(p) < 7 {
				return nil, nil, nil, fmt.Errorf("block %s: malformed", id)
			}
			if p[1] == p[0] {
				p[1] = ""
			}
			tail := ""
			if len(p) == 8 && strings.HasPrefix(p[7], "@") {
				tail = "|" + p[7]
			} else if len(p) == 8 && p[7] != "" {
				set = append(set, "m:"+cid, p[7])
				inline[cid] = true
			}
			nv := strings.Join(p[:7], "|") + tail
			switch {
			case moved:
				from(f)
				del = append(del, f)
				set = append(set, "b:"+cid, nv)
				idsMoved = true
			case nv != v:
				from(f)
				set = append(set, f, nv)
			}
		case strings.HasPrefix(f, "r:"):
			p := strings.SplitN(v, "|", 11)
			if len(p) != 11 {
				return nil, nil, nil, fmt.Errorf("reservation %s: malformed", f[2:])
			}
			if p[10] != "" {
				from(f)
				set = append(set, "n:"+f[2:], p[10], f, v[:len(v)-len(p[10])])
			}
		}
	}
	for _, f := range names {
		if !strings.HasPrefix(f, "m:") {
			continue
		}
		if cid, ok := compactOf(f[2:]); ok {
			from(f)
			del = append(del, f)
			if !inline[cid] {
				set = append(set, "m:"+cid, h[f])
			}
		}
	}
	if idsMoved {
		for _, f := range []string{"s", "o", "k"} {
			if _, ok := h[f]; ok {
				del = append(del, f)
			}
		}
	}
	return check, del, set, nil
}

// compactOf is id in engine.CompactID's form when id is UUID text (the
// 36-character form an older hash kept).
func compactOf(id string) (string, bool) {
	if len(id) != 36 {
		return "", false
	}
	u, err := uuid.Parse(id)
	if err != nil {
		return "", false
	}
	return engine.CompactID(u), true
}

// globEscape is s with SCAN MATCH's special characters escaped (a key
// prefix is free text).
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
