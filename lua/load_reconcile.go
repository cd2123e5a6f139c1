package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// The store's side of a reconcile pass (engine.Reconcile, issue 11): read
// many accounts' raw state, and reload one from Postgres over a hash that
// diverged, fenced on the version the pass compared (load.lua's expected
// version).

// Compile-time check that Store is the engine's reconcile store.
var _ engine.ReconcileStore = (*Store)(nil)

// reconcileWholeFields is the most fields an account hash may have for a
// reconcile pass to read it with one HGETALL pipelined with the rest of its
// page; a bigger one (thousands of blocks and reservations, megabytes of metadata
// at the caps) is read in bounded slices on its own, as the read path does.
const reconcileWholeFields = 1000

// StoredAccounts reads the customers' account hashes: one pipelined HLEN
// per page (per cluster node), then one pipelined HGETALL for the small
// ones and a sliced read of each big one. A customer without a hash comes
// back with Present false.
func (s *Store) StoredAccounts(ctx context.Context, customers []uuid.UUID) ([]engine.StoredAccount, error) {
	out := make([]engine.StoredAccount, len(customers))
	if len(customers) == 0 {
		return out, nil
	}
	keys := make([]string, len(customers))
	for i, c := range customers {
		keys[i] = s.accountKey(c)
	}
	lens := make([]*redis.IntCmd, len(keys))
	if _, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			lens[i] = pipe.HLen(ctx, k)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lua: reconcile: hlen: %w", err)
	}
	all := make([]*redis.MapStringStringCmd, len(keys))
	if _, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range keys {
			if n := lens[i].Val(); n > 0 && n <= reconcileWholeFields {
				all[i] = pipe.HGetAll(ctx, k)
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("lua: reconcile: hgetall: %w", err)
	}
	for i, k := range keys {
		var a accountFields
		var err error
		switch {
		case lens[i].Val() == 0:
			continue
		case all[i] != nil:
			raw := all[i].Val()
			if len(raw) == 0 {
				continue // gone between the two reads
			}
			a, err = decodeAccount(raw)
		default:
			a, err = s.readAccountSliced(ctx, k, false)
			if errors.Is(err, engine.ErrStateMissing) {
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("lua: reconcile: account %s: %w", customers[i], err)
		}
		var gauges map[string]string
		if all[i] != nil {
			gauges = all[i].Val()
		} else if gauges, err = s.gaugeFields(ctx, k); err != nil {
			return nil, fmt.Errorf("lua: reconcile: account %s: %w", customers[i], err)
		}
		g, leases, err := decodeGauges(gauges)
		if err != nil {
			return nil, fmt.Errorf("lua: reconcile: account %s: %w", customers[i], err)
		}
		out[i] = engine.StoredAccount{Present: true, AccountID: a.id, Version: a.version, Reserved: a.reserved,
			LifetimeEarned: a.lifetimeEarned, Debt: a.debt, Blocks: a.blocks, Gauges: g, Leases: leases,
			Budgets: budgetFields(gauges)}
	}
	return out, nil
}

// gaugeFields reads the gauge fields ("g:<metric>" counters and
// "L:<metric>" leases, prelude/gauges.lua) and the budget counters ("u:...",
// prelude/budgets.lua budget_take) of a hash too big for one HGETALL, by
// HSCAN: bounded steps, as the sliced read of its blocks is.
func (s *Store) gaugeFields(ctx context.Context, key string) (map[string]string, error) {
	out := map[string]string{}
	for _, match := range []string{"g:*", "L:*", "u:*"} {
		var cursor uint64
		for {
			kv, next, err := s.rdb.HScan(ctx, key, cursor, match, reconcileWholeFields).Result()
			if err != nil {
				return nil, fmt.Errorf("hscan %s: %w", match, err)
			}
			for j := 0; j+1 < len(kv); j += 2 {
				out[kv[j]] = kv[j+1]
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return out, nil
}

// budgetFields are the budget counter fields ("u:...") of an account
// hash's fields; nil when it has none.
func budgetFields(fields map[string]string) map[string]string {
	var out map[string]string
	for f, v := range fields {
		// "u:" a budget's counter, "p:" the draw limit's (shared pools).
		if strings.HasPrefix(f, "u:") || strings.HasPrefix(f, "p:") {
			if out == nil {
				out = map[string]string{}
			}
			out[f] = v
		}
	}
	return out
}

// decodeGauges reads the gauge counters and active leases out of an
// account hash's fields (the others are skipped): "g:<metric>" is the
// counter, "L:<metric>" the leases "id,amount,expires,created,seconds"
// joined by spaces (lua/leases.go leaseFields writes the same form).
func decodeGauges(fields map[string]string) (map[string]int64, []engine.StoredLease, error) {
	gauges := map[string]int64{}
	var leases []engine.StoredLease
	for f, v := range fields {
		switch {
		case strings.HasPrefix(f, "g:"):
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, nil, fmt.Errorf("gauge field %s: %w", f, err)
			}
			gauges[f[2:]] = n
		case strings.HasPrefix(f, "L:"):
			for _, l := range strings.Fields(v) {
				p := strings.Split(l, ",")
				if len(p) != 5 {
					return nil, nil, fmt.Errorf("lease field %s: %q", f, l)
				}
				id, err := uuid.Parse(p[0])
				if err != nil {
					return nil, nil, fmt.Errorf("lease field %s: %w", f, err)
				}
				var n [4]int64
				for j := range n {
					if n[j], err = strconv.ParseInt(p[j+1], 10, 64); err != nil {
						return nil, nil, fmt.Errorf("lease field %s: %w", f, err)
					}
				}
				leases = append(leases, engine.StoredLease{Metric: f[2:], MutationLease: engine.MutationLease{ID: id,
					Amount: n[0], Status: engine.LeaseActive, ExpiresMS: n[1], CreatedMS: n[2], Seconds: n[3]}})
			}
		}
	}
	return gauges, leases, nil
}

// Reload writes st over the customer's hash whatever the versions, but
// only while the hash still holds version expect (-1: no hash), so a
// script that moved the account since the comparison is never overwritten.
// It reports whether it wrote.
func (s *Store) Reload(ctx context.Context, st engine.AccountState, expect int64) (bool, error) {
	var c loadCall
	if err := s.loadArgsExpecting(&c, st, s.clock.Now(), strconv.FormatInt(expect, 10)); err != nil {
		return false, err
	}
	got, err := s.call(ctx, loadScript, c.keys, c.argv()...).Int64Slice()
	if err != nil {
		return false, scriptError("load", err)
	}
	if len(got) != 1 {
		return false, fmt.Errorf("lua: reload: %d replies for one account", len(got))
	}
	return got[0] == 1, nil
}
