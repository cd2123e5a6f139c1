package lua

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store keeps the fleet-wide rate budgets.
var _ engine.RateBudgets = (*Store)(nil)

var (
	//go:embed gcra.lua
	gcraLua    string
	gcraScript = redis.NewScript(gcraLua)
	// The same take is a body of the library too, for a fused door's rate
	// (door_fused.lua).
	_ = newScript("gcra", gcraLua)
)

// rateKey is the budget of one API key. It shares the tenant's hash tag (as
// the delivery slots do), so a tenant's keys live on one Cluster slot.
func (s *Store) rateKey(tenant, key uuid.UUID) string {
	return s.tenantKey(tenant, ":rl:"+key.String())
}

// TakeRate spends up to requests of key's budget (a lease: all when they
// fit, else as many as fit, else none) with one EVALSHA of gcra.lua: the
// budget lives in Redis, so every node that shares the Redis shares it.
// perSecond, burst and requests must be at least 1; a zero now uses
// Redis' clock.
// Errors are Redis' (the caller decides what an unreachable Redis means).
func (s *Store) TakeRate(ctx context.Context, tenant, key uuid.UUID, perSecond, burst, requests int, now time.Time) (engine.RateDecision, error) {
	if perSecond < 1 || burst < 1 || requests < 1 {
		return engine.RateDecision{}, rateArgsError(perSecond, burst, requests)
	}
	var nowMicros int64
	if !now.IsZero() {
		nowMicros = now.UnixMicro()
	}
	cmd := gcraScript.Run(ctx, s.rdb, []string{s.rateKey(tenant, key)}, perSecond, burst, nowMicros, requests)
	return rateReply(cmd, burst)
}

// rateCmd is the EVALSHA of gcra.lua that TakeRate sends, for DoorTrip's
// round trip (a NOSCRIPT answer is for the caller to retry by
// rateFencedRun), fenced on the tenant's stamp when ask says so.
func (s *Store) rateCmd(ctx context.Context, tenant uuid.UUID, ask *engine.RateAsk) (*redis.Cmd, error) {
	keys, args, err := s.rateArgs(tenant, ask)
	if err != nil {
		return nil, err
	}
	return redis.NewCmd(ctx, append([]any{"evalsha", gcraScript.Hash(), len(keys)}, append(toAny(keys), args...)...)...), nil
}

// rateFencedRun is rateCmd's take run on its own, loading the script when
// Redis lost it.
func (s *Store) rateFencedRun(ctx context.Context, tenant uuid.UUID, ask *engine.RateAsk) *redis.Cmd {
	keys, args, _ := s.rateArgs(tenant, ask) // rateCmd checked them
	return gcraScript.Run(ctx, s.rdb, keys, args...)
}

// rateArgs is gcra.lua's keys and arguments for ask.
func (s *Store) rateArgs(tenant uuid.UUID, ask *engine.RateAsk) ([]string, []any, error) {
	if ask.PerSecond < 1 || ask.Burst < 1 || ask.Requests < 1 {
		return nil, nil, rateArgsError(ask.PerSecond, ask.Burst, ask.Requests)
	}
	var nowMicros int64
	if !ask.Now.IsZero() {
		nowMicros = ask.Now.UnixMicro()
	}
	keys := []string{s.rateKey(tenant, ask.Key)}
	args := []any{ask.PerSecond, ask.Burst, nowMicros, ask.Requests}
	if ask.Fenced {
		keys = append(keys, s.stampsKey(tenant))
		args = append(args, engine.StampTenant.String(), strconv.FormatUint(ask.Stamp, 10))
	}
	return keys, args, nil
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, v := range ss {
		out[i] = v
	}
	return out
}

// rateFenceMoved is gcra.lua's reply to a fenced take whose stamp moved.
const rateFenceMoved = -1

// rateReply reads an answered take of a budget whose burst is burst.
func rateReply(cmd *redis.Cmd, burst int) (engine.RateDecision, error) {
	res, err := cmd.Int64Slice()
	if err != nil {
		return engine.RateDecision{}, fmt.Errorf("lua: rate budget: %w", err)
	}
	if len(res) != 4 {
		return engine.RateDecision{}, fmt.Errorf("lua: rate budget: reply of %d items, want 4", len(res))
	}
	return engine.RateDecision{
		Allowed:    res[0] > 0,
		Granted:    int(res[0]),
		Limit:      burst,
		Remaining:  int(res[1]),
		RetryAfter: time.Duration(res[2]) * time.Microsecond,
		Reset:      time.Duration(res[3]) * time.Microsecond,
	}, nil
}
