package lua

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store makes a request's first round trip.
var _ engine.DoorTrips = (*Store)(nil)

// DoorTrip sends what a request asks of Redis before its endpoint in one
// round trip (issue 26): the tenant's change stamps (HMGET), and when ask
// says so a take of the key's rate budget (EVALSHA gcra.lua) and the
// idempotency claim (SET NX GET PX), written together through the
// coalescer. The stamps and the budget share the tenant's hash tag; the
// claim's record spreads over every slot, so on a Cluster its node may be
// another, which go-redis's pipeline reaches in parallel. Each part
// answers on its own: an error of one leaves the others' answers good.
func (s *Store) DoorTrip(ctx context.Context, ask engine.DoorAsk) engine.DoorAnswer {
	var out engine.DoorAnswer
	stamps := s.stampsCmd(ctx, ask.Tenant)
	more := make([]redis.Cmder, 0, 2)
	var rate *redis.Cmd
	if r := ask.Rate; r != nil {
		var err error
		if rate, err = s.rateCmd(ctx, ask.Tenant, r); err != nil {
			out.RateErr = err
		} else {
			more = append(more, rate)
		}
	}
	var claim *redis.StringCmd
	var head []byte
	if c := ask.Claim; c != nil {
		var err error
		if claim, head, err = s.claimCmd(ctx, ask.Tenant, c.Key, c.RequestHash, c.LockTTL); err != nil {
			out.ClaimErr = err
		} else {
			more = append(more, claim)
		}
	}
	err := s.trips.doGroup(ctx, stamps, more)
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errLeftInFlight)) {
		// The group was never answered: nothing can be read from it.
		out.StampsErr = err
		if rate != nil {
			out.RateErr = err
		}
		if claim != nil {
			out.ClaimErr = err
		}
		return out
	}
	out.Stamps, out.StampsErr = stampsReply(stamps)
	if rate != nil {
		out.Rate, out.RateStale, out.RateErr = s.rateAnswer(ctx, ask.Tenant, ask.Rate, rate)
	}
	if claim != nil {
		out.Claim, out.Claimed, out.ClaimErr = claimReply(claim, head)
	}
	return out
}

// rateAnswer reads an answered take of ask (rateCmd) sent in a group:
// stale when its fence found the tenant's stamp moved (nothing taken). A
// take Redis lacked the script for is run again on its own.
func (s *Store) rateAnswer(ctx context.Context, tenant uuid.UUID, ask *engine.RateAsk, rate *redis.Cmd) (rd engine.RateDecision, stale bool, err error) {
	if isNoScript(rate.Err()) {
		// Redis lost its scripts (a restart, a failover): this take
		// alone loads it again.
		rate = s.rateFencedRun(ctx, tenant, ask)
	}
	if v, err := rate.Int64Slice(); err == nil && len(v) > 0 && v[0] == rateFenceMoved {
		return engine.RateDecision{}, true, nil
	}
	rd, err = rateReply(rate, ask.Burst)
	return rd, false, err
}

// isNoScript tells Redis's answer to an EVALSHA of a script it does not hold.
func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// rateArgsError is a rate take's error when its figures are out of range.
func rateArgsError(perSecond, burst, requests int) error {
	return fmt.Errorf("lua: rate budget: rate %d/s burst %d requests %d must be at least 1", perSecond, burst, requests)
}
