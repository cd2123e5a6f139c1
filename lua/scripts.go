package lua

import (
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// The money and state scripts. Each is the prelude (lua/prelude/, joined
// in prelude.go: money arithmetic, the block encoding, the Mutation JSON)
// followed by its own file, wrapped once so Script.Run sends EVALSHA and
// falls back to EVAL after a server restart.
var (
	//go:embed grant.lua
	grantLua string
	//go:embed debit.lua
	debitLua string
	//go:embed expire.lua
	expireLua string
	//go:embed load.lua
	loadLua string
	//go:embed consume.lua
	consumeLua string
	//go:embed consume_multi.lua
	consumeMultiLua string
	//go:embed reserve.lua
	reserveLua string
	//go:embed commit.lua
	commitLua string
	//go:embed reserve_multi.lua
	reserveMultiLua string
	//go:embed commit_multi.lua
	commitMultiLua string
	//go:embed release.lua
	releaseLua string
	//go:embed extend.lua
	extendLua string
	//go:embed gauge.lua
	gaugeLua string
	//go:embed gauge_value.lua
	gaugeValueLua string

	grantScript   = newScript("grant", grantLua)
	debitScript   = newScript("debit", debitLua)
	expireScript  = newScript("expire", expireLua)
	loadScript    = newScript("load", loadLua)
	consumeScript = newScript("consume", consumeLua)
	// consumeMultiScript charges a multi-metric consume.
	consumeMultiScript = newScript("consume_multi", consumeMultiLua)
	reserveScript      = newScript("reserve", reserveLua)
	commitScript       = newScript("commit", commitLua)
	// reserveMultiScript and commitMultiScript hold and settle a
	// multi-metric reservation.
	reserveMultiScript = newScript("reserve_multi", reserveMultiLua)
	commitMultiScript  = newScript("commit_multi", commitMultiLua)
	releaseScript      = newScript("release", releaseLua)
	extendScript       = newScript("extend", extendLua)
	gaugeScript        = newScript("gauge", gaugeLua)
	// gauge_value.lua is a two-line read: it needs no prelude.
	gaugeValueScript = redis.NewScript(gaugeValueLua)
)

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
	"NOPOOLSTATE":  engine.ErrPoolStateMissing,
	"INSUFFICIENT": engine.ErrInsufficientCredits,
	"NOACCOUNT":    engine.ErrNoAccount,
	"OVERFLOW":     engine.ErrOverflow,
	"NOMATCH":      engine.ErrStackNoMatch,
	"MISMATCH":     engine.ErrIdempotencyMismatch,
	"NOTFOUND":     engine.ErrReservationNotFound,
	"NOTACTIVE":    engine.ErrReservationNotActive,
	"EXPIRED":      engine.ErrReservationExpired,
	"SHORTER":      engine.ErrReservationShorter,
	"NOTDUE":       ErrReservationNotDue,
	"BELOWZERO":    engine.ErrGaugeBelowZero,
	// Per-customer bounds of invariant 13 (prelude/bounds.lua MAX_LIVE_BLOCKS,
	// MAX_ACTIVE_RESERVATIONS).
	"TOOMANYBLOCKS":       engine.ErrTooManyBlocks,
	"TOOMANYRESERVATIONS": engine.ErrTooManyReservations,
	"STALE":               errStale,
	"MAYBESEEN":           errMaybeSeen,
}

// ErrReservationNotDue is Release's answer to an expiry (ReleaseCommand.Expire)
// of a reservation whose expires_at has not passed: nothing changed. It matches
// engine.ErrReservationNotActive under errors.Is, so a sweep that skips
// holds no longer active skips it too.
var ErrReservationNotDue error = notDueError{}

type notDueError struct{}

func (notDueError) Error() string { return "the reservation is not due to expire" }
func (notDueError) Unwrap() error { return engine.ErrReservationNotActive }

// scriptError turns a script's error reply into the engine error its code
// names; any other error (network, BADARG from a caller bug) is wrapped.
func scriptError(script string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		code, rest, _ := strings.Cut(rerr.Error(), " ")
		if e, ok := scriptErrors[code]; ok {
			return e
		}
		if code == "BUDGET" {
			if e, ok := budgetError(rest); ok {
				return e
			}
		}
		if code == "GAUGECAP" {
			if e, ok := gaugeCapError(rest); ok {
				return e
			}
		}
	}
	return fmt.Errorf("lua: %s: %w", script, err)
}

// budgetError reads prelude/budgets.lua budget_refuse's "<field> <limit> <spent>
// <end ms>".
func budgetError(rest string) (*engine.Error, bool) {
	f := strings.Fields(rest)
	if len(f) != 4 {
		return nil, false
	}
	var n [3]int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, false
		}
		n[i] = v
	}
	return engine.BudgetExceededError(f[0], n[0], n[1], time.UnixMilli(n[2])), true
}

// gaugeCapError reads gauge.lua's "<current> <cap> <shortfall>".
func gaugeCapError(rest string) (*engine.Error, bool) {
	f := strings.Fields(rest)
	if len(f) != 3 {
		return nil, false
	}
	var n [3]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, false
		}
		n[i] = v
	}
	return engine.GaugeCapError(n[0], n[1], n[2]), true
}

// mutationReply decodes a money script's {status, mutation JSON} reply
// (a consume, new or replayed, may answer with its compact op record
// instead, oprecord.go: its caller names the customer,
// fillRecordCustomer); ok is false for the "noop" status.
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
	if len(body) > 0 && body[0] == opRecordConsume {
		m, err := decodeConsumeRecord(body)
		if err != nil {
			return res, false, fmt.Errorf("lua: %s: %w", script, err)
		}
		return engine.MutationResult{Mutation: m, Replayed: status == replyReplay}, true, nil
	}
	if err := engine.DecodeMutationString(body, &res.Mutation); err != nil {
		return res, false, fmt.Errorf("lua: %s: decode mutation: %w", script, err)
	}
	res.Replayed = status == replyReplay
	return res, true, nil
}
