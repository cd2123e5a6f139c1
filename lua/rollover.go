package lua

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/creditd/creditd/engine"
)

var (
	//go:embed rollover.lua
	rolloverLua    string
	rolloverScript = newScript("rollover", rolloverLua)
)

var _ engine.RolloverStore = (*Store)(nil)

// Rollover expires cmd.Blocks and carries cmd.Percentage of their unused
// credit into cmd.Block (rollover.lua). A zero Mutation means no listed
// block had credit left. Errors: engine.ErrStateMissing,
// ErrIdempotencyMismatch; a retried key replays the original Mutation.
func (s *Store) Rollover(ctx context.Context, cmd engine.RolloverCommand) (engine.MutationResult, error) {
	return s.appliedFirst(ctx, engine.CommandHeader{Customer: cmd.Customer, IdempotencyKey: cmd.IdempotencyKey}, time.Time{},
		func(ctx context.Context) (engine.MutationResult, error) { return s.rollover(ctx, cmd) })
}

// rollover is Rollover once Postgres does not hold the key (appliedFirst).
func (s *Store) rollover(ctx context.Context, cmd engine.RolloverCommand) (engine.MutationResult, error) {
	if err := checkSource(cmd.Block.Source); err != nil {
		return engine.MutationResult{}, fmt.Errorf("lua: rollover: %w", err)
	}
	head, err := newHead(cmd.Now, cmd.OpID, cmd.Customer, cmd.IdempotencyKey, "")
	if err != nil {
		return engine.MutationResult{}, err
	}
	// Each listed block as the account hash names it (engine.CompactID):
	// the script finds a block by its field name.
	ids := make([]string, 0, len(cmd.Blocks))
	for _, id := range cmd.Blocks {
		ids = append(ids, engine.CompactID(id))
	}
	idsJSON, err := json.Marshal(ids)
	if err != nil {
		return engine.MutationResult{}, err
	}
	blockMeta, err := jsonText(cmd.Block.Metadata)
	if err != nil {
		return engine.MutationResult{}, err
	}
	entryMeta, err := jsonText(cmd.EntryMetadata)
	if err != nil {
		return engine.MutationResult{}, err
	}
	expires := ""
	if cmd.Block.ExpiresAt != nil {
		expires = strconv.FormatInt(cmd.Block.ExpiresAt.UnixMilli(), 10)
	}
	a := rolloverArgv{headArgv: head, Blocks: string(idsJSON), Percent: strconv.Itoa(cmd.Percentage),
		BlockID: engine.CompactID(cmd.Block.ID), Priority: strconv.Itoa(cmd.Block.Priority),
		Source: string(cmd.Block.Source), BlockMeta: blockMeta, Expires: expires, EntryType: string(cmd.EntryType),
		EntryMeta: entryMeta, Ctx: contextText(cmd.Context)}
	return s.runMoney(ctx, rolloverScript, "rollover", s.moneyKeys(cmd.Customer.CustomerID, cmd.IdempotencyKey), a.list())
}
