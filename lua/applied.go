package lua

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// Compile-time check that Store lets the persister shorten op keys.
var _ engine.OpRecords = (*Store)(nil)

// OpRetention is the life a money script gives an op key
// (idempotency.OpKeyRetention): a safety net, since the persister shortens the
// key to idempotency.OpKeyGrace once the operation is in Postgres.
const OpRetention = idempotency.OpKeyRetention

// WithAppliedOps makes every money call with an idempotency key ask a first
// (Postgres, engine.AppliedOps) whether the key was applied to the customer
// already, so a retry whose op key Redis has let go replays instead of
// applying twice (invariant 4, forever). Without it (unit tests of the
// scripts alone) the op key is the only memory.
func (s *Store) WithAppliedOps(a engine.AppliedOps) *Store {
	s.applied = a
	return s
}

// appliedFirst runs a money call for the idempotency key of h's customer
// without asking Postgres when it can (issue 26): run's script consults
// the seen filter (seen.go) when the op key is absent, and only when the
// filter may know the key (MAYBESEEN: a seen key, a false positive, or a
// partition not seeded yet) is Postgres asked (a failed look-up is
// engine.ErrAppliedUnknown, a 503, and runs nothing). When Postgres holds
// the key's operation for c the call is answered from it (Replayed, or
// ErrIdempotencyMismatch for another request hash); otherwise run runs
// again, without the filter, under a deadline of idempotency.AppliedLookupFresh
// after the look-up, so an operation committed after the look-up missed it
// still has its op key when the script runs (idempotency.OpKeyGrace).
// checkedAt, when recent, is a look-up the caller made already (a usage
// batch looks all its events up at once).
func (s *Store) appliedFirst(ctx context.Context, h engine.CommandHeader, checkedAt time.Time,
	run func(context.Context) (engine.MutationResult, error)) (engine.MutationResult, error) {
	c, key, requestHash := h.Customer, h.IdempotencyKey, h.RequestHash
	if key == "" || s.applied == nil {
		return run(ctx)
	}
	if !idempotency.LookupStands(checkedAt, time.Now()) {
		res, err := run(withSeen(ctx, s.seenKeys(Partition(c.CustomerID), h.Now)))
		if !errors.Is(err, errMaybeSeen) {
			return res, err
		}
		checkedAt = time.Now()
		ms, found, err := s.applied.AppliedOps(ctx, []engine.OpRef{{Customer: c, Key: key}})
		if err != nil {
			return engine.MutationResult{}, fmt.Errorf("lua: applied look-up: %w: %w", engine.ErrAppliedUnknown, err)
		}
		if found[0] {
			return appliedReplay(ms[0], requestHash)
		}
	}
	ctx, cancel := context.WithDeadline(ctx, checkedAt.Add(idempotency.AppliedLookupFresh))
	defer cancel()
	return run(ctx)
}

// appliedReplay answers a retry from its persisted Mutation m, as a script
// answers from an op key: the original, or a mismatch when m was produced
// by another request.
func appliedReplay(m engine.Mutation, requestHash string) (engine.MutationResult, error) {
	if m.RequestHash != requestHash {
		return engine.MutationResult{}, engine.ErrIdempotencyMismatch
	}
	return engine.MutationResult{Mutation: m, Replayed: true}, nil
}

// appliedRef is one call of a batch as the Postgres look-up sees it; key
// "" is not looked up.
type appliedRef struct {
	customer    engine.CustomerKey
	key         string
	requestHash string
	found       engine.Mutation
}

// appliedBatch looks up the keys of refs (GrantBatch, ConsumeBatch) in one
// call: for each call applied already, done is set, its outcome is in errs
// (nil, or the mismatch) and its Mutation in refs[i].found.
func (s *Store) appliedBatch(ctx context.Context, refs []appliedRef) (done []bool, errs []error, err error) {
	done, errs = make([]bool, len(refs)), make([]error, len(refs))
	if s.applied == nil {
		return done, errs, nil
	}
	ask := make([]engine.OpRef, 0, len(refs))
	at := make([]int, 0, len(refs))
	for i, r := range refs {
		if r.key != "" {
			ask = append(ask, engine.OpRef{Customer: r.customer, Key: r.key})
			at = append(at, i)
		}
	}
	if len(ask) == 0 {
		return done, errs, nil
	}
	ms, found, err := s.applied.AppliedOps(ctx, ask)
	if err != nil {
		return nil, nil, fmt.Errorf("lua: applied look-up: %w: %w", engine.ErrAppliedUnknown, err)
	}
	for j, i := range at {
		if found[j] {
			done[i] = true
			var res engine.MutationResult
			res, errs[i] = appliedReplay(ms[j], refs[i].requestHash)
			refs[i].found = res.Mutation
		}
	}
	return done, errs, nil
}

// ForgetOps adds the op keys of ms, committed mutations of outbox
// partition p, to the seen filter and shortens them to idempotency.OpKeyGrace
// (engine.OpRecords; seen.go forgetOps), then does the same for the claims
// of the usage events among them (usage_ids.go forgetUsage).
func (s *Store) ForgetOps(ctx context.Context, p int, ms []engine.Mutation) error {
	if err := s.checkOutboxPartition(p); err != nil {
		return err
	}
	if err := s.forgetOps(ctx, p, ms); err != nil {
		return err
	}
	return s.forgetUsage(ctx, ms)
}
