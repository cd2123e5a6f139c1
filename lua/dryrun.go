package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// dryRunTTL bounds a dry run's scratch keys should the run die before it
// deletes them.
const dryRunTTL = 10 * time.Second

// ConsumeDry runs cmd as Consume would, on a scratch copy of the
// customer's account, and returns the Mutation the charge would write
// without changing anything (issue 28 item 5). The very script of a real
// consume runs, so the answer is exactly the charge's: the copy and a
// scratch outbox share the account's hash tag, so this works on a Cluster
// too. A refusal returns its error with the refusal record the script
// would have appended (the events it would fire). cmd must carry no
// idempotency key: a dry run neither claims nor replays one.
// Errors: as Consume's; ErrStateMissing when Redis holds no account.
func (s *Store) ConsumeDry(ctx context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	if cmd.IdempotencyKey != "" {
		return engine.MutationResult{}, errors.New("lua: consume dry run: a dry run takes no idempotency key")
	}
	name, sc := "consume", consumeScript
	var keys []string
	var args []any
	var err error
	if cmd.Items != nil {
		name, sc = "consume_multi", consumeMultiScript
		keys, args, err = s.consumeMultiArgs(cmd)
	} else {
		keys, args, err = s.consumeArgs(cmd)
	}
	if err != nil {
		return engine.MutationResult{}, err
	}
	parent := uuid.Nil
	if cmd.Pool != nil {
		parent = cmd.Pool.Parent.CustomerID
	}
	return s.dryRun(ctx, cmd.Customer.CustomerID, parent, name, sc, keys, args)
}

// dryRun runs sc with keys[0] (the account) replaced by a scratch copy and
// every other key (the outbox, a reservation-expiry zset) by an empty scratch key,
// reads what the script appended to the outbox and deletes them all. With
// a parent (not uuid.Nil) the parent's account is copied too, beside the
// scratch account under the name the script derives from it (prelude
// pool_of: the account key's tail is the customer id).
func (s *Store) dryRun(ctx context.Context, customer, parent uuid.UUID, name string, sc *script, keys []string, args []any) (engine.MutationResult, error) {
	scratch := s.tag(Partition(customer)) + ":dry:" + uuid.NewString()
	dry := make([]string, len(keys))
	for i := range keys {
		dry[i] = scratch + ":" + strconv.Itoa(i)
	}
	dry[0] = scratch + ":" + customer.String()
	if parent != uuid.Nil {
		dry = append(dry, scratch+":"+parent.String())
	}
	account, outbox := dry[0], dry[1]
	defer func() {
		// A scratch key left behind expires by itself (dryRunTTL).
		_ = s.rdb.Del(context.WithoutCancel(ctx), dry...).Err()
	}()
	var copied, parentCopied *redis.IntCmd
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		copied = p.Copy(ctx, keys[0], account, 0, false)
		p.PExpire(ctx, account, dryRunTTL)
		if parent != uuid.Nil {
			parentCopied = p.Copy(ctx, s.accountKey(parent), dry[len(dry)-1], 0, false)
			p.PExpire(ctx, dry[len(dry)-1], dryRunTTL)
		}
		return nil
	}); err != nil {
		return engine.MutationResult{}, scriptError(name, s.unavail.classify(err))
	}
	if copied.Val() == 0 {
		return engine.MutationResult{}, engine.ErrStateMissing
	}
	if parentCopied != nil && parentCopied.Val() == 0 {
		return engine.MutationResult{}, engine.ErrPoolStateMissing
	}
	v, runErr := s.call(ctx, sc, dry[:len(keys)], args...).Result()
	// The other keys exist only if the script wrote them; they get the
	// same bound before they are read.
	_, _ = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range dry[1:len(keys)] {
			p.PExpire(ctx, k, dryRunTTL)
		}
		return nil
	})
	var res engine.MutationResult
	if runErr == nil {
		var err error
		if res, _, err = mutationReply(name, v); err != nil {
			return engine.MutationResult{}, err
		}
		if parent != uuid.Nil && res.Mutation.Usage != nil && res.Mutation.Usage.Pool > 0 {
			// The parent's share is its own Mutation, appended to the
			// scratch outbox before the child's (prelude pool_take).
			if res.Pool, err = s.dryParent(ctx, name, outbox, parent); err != nil {
				return engine.MutationResult{}, err
			}
		}
		return res, nil
	}
	runErr = scriptError(name, s.unavail.classify(runErr))
	if !errors.Is(runErr, engine.ErrInsufficientCredits) && !errors.Is(runErr, engine.ErrBudgetExceeded) {
		return engine.MutationResult{}, runErr
	}
	// A refusal appended its record (a budget's, only the first of its
	// period): the events it would fire.
	msgs, err := s.rdb.XRange(ctx, outbox, "-", "+").Result()
	if err != nil {
		return engine.MutationResult{}, scriptError(name, s.unavail.classify(err))
	}
	for _, m := range msgs {
		body, ok := m.Values["m"].(string)
		if !ok {
			continue
		}
		if err := engine.DecodeMutationString(body, &res.Mutation); err != nil {
			return engine.MutationResult{}, fmt.Errorf("lua: %s dry run: decode refusal: %w", name, err)
		}
	}
	return res, runErr
}

// dryParent reads the parent's Mutation a pooled dry run appended to its
// scratch outbox.
func (s *Store) dryParent(ctx context.Context, name, outbox string, parent uuid.UUID) (*engine.Mutation, error) {
	msgs, err := s.rdb.XRange(ctx, outbox, "-", "+").Result()
	if err != nil {
		return nil, scriptError(name, s.unavail.classify(err))
	}
	for _, m := range msgs {
		body, ok := m.Values["m"].(string)
		if !ok {
			continue
		}
		var mu engine.Mutation
		if err := engine.DecodeMutationString(body, &mu); err != nil {
			return nil, fmt.Errorf("lua: %s dry run: decode the parent's share: %w", name, err)
		}
		if mu.CustomerID == parent {
			return &mu, nil
		}
	}
	return nil, fmt.Errorf("lua: %s dry run: the parent's share is missing from the outbox", name)
}
