package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"

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
// page; a bigger one (thousands of blocks and holds, megabytes of metadata
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
		out[i] = engine.StoredAccount{Present: true, AccountID: a.id, Version: a.version, Reserved: a.reserved,
			LifetimeEarned: a.lifetimeEarned, Blocks: a.blocks}
	}
	return out, nil
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
