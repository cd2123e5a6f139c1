package lua

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// The money and state scripts. Each is prelude.lua (money arithmetic, the
// block encoding, the Mutation JSON) followed by its own file, wrapped once
// so Script.Run sends EVALSHA and falls back to EVAL after a server restart.
var (
	//go:embed prelude.lua
	preludeLua string
	//go:embed grant.lua
	grantLua string
	//go:embed debit.lua
	debitLua string
	//go:embed expire.lua
	expireLua string
	//go:embed snapshot.lua
	snapshotLua string
	//go:embed load.lua
	loadLua string

	grantScript    = withPrelude(grantLua)
	debitScript    = withPrelude(debitLua)
	expireScript   = withPrelude(expireLua)
	snapshotScript = withPrelude(snapshotLua)
	loadScript     = withPrelude(loadLua)
)

func withPrelude(body string) *redis.Script { return redis.NewScript(preludeLua + "\n" + body) }

// Reply statuses of the money scripts ({status, mutation JSON}).
const (
	replyNew    = "new"
	replyReplay = "replay"
	replyNoop   = "noop"
)

// scriptErrors maps the codes the scripts reply with (the first word of the
// error) to the engine's sentinel errors.
var scriptErrors = map[string]error{
	"NOSTATE":      engine.ErrStateMissing,
	"INSUFFICIENT": engine.ErrInsufficientCredits,
	"NOACCOUNT":    engine.ErrNoAccount,
	"OVERFLOW":     engine.ErrOverflow,
	"NOMATCH":      engine.ErrStackNoMatch,
	"MISMATCH":     engine.ErrIdempotencyMismatch,
}

// scriptError turns a script's error reply into the engine error its code
// names; any other error (network, BADARG from a caller bug) is wrapped.
func scriptError(script string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		code, _, _ := strings.Cut(rerr.Error(), " ")
		if e, ok := scriptErrors[code]; ok {
			return e
		}
	}
	return fmt.Errorf("lua: %s: %w", script, err)
}

// mutationReply decodes a money script's {status, mutation JSON} reply;
// ok is false for the "noop" status.
func mutationReply(script string, v any) (res engine.MutationResult, ok bool, err error) {
	parts, isSlice := v.([]any)
	if !isSlice || len(parts) != 2 {
		return res, false, fmt.Errorf("lua: %s: unexpected reply %T", script, v)
	}
	status, _ := parts[0].(string)
	body, _ := parts[1].(string)
	switch status {
	case replyNoop:
		return res, false, nil
	case replyNew, replyReplay:
	default:
		return res, false, fmt.Errorf("lua: %s: unexpected reply status %q", script, status)
	}
	if err := json.Unmarshal([]byte(body), &res.Mutation); err != nil {
		return res, false, fmt.Errorf("lua: %s: decode mutation: %w", script, err)
	}
	res.Replayed = status == replyReplay
	return res, true, nil
}
