package lua

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store checks read doors in its reads.
var _ engine.ReadFuser = (*Store)(nil)

// FusesReads: every Store does. The stamps and the read share a round
// trip on one Redis; on a Cluster they go to their two nodes at once
// (the coalescer's pipeline), so the request still waits for one trip.
func (s *Store) FusesReads() bool { return true }

// doRead sends cmd, a request's read, through the coalescer; under an
// open read door (engine.FusedDoor.Read) the tenant's stamps go with it in
// the same round trip and settle the door: a stamp moved since the
// request's caches were read (or unreadable) answers
// engine.ErrFusedStale, and the request goes the usual way.
func (s *Store) doRead(ctx context.Context, cmd redis.Cmder) error {
	d := engine.FusedDoorOf(ctx)
	if !d.ReadOpen() {
		return s.trips.do(ctx, cmd)
	}
	if !d.Checked {
		d.Settle(engine.FusedChecked) // a node alone: no stamps to check
		return s.trips.do(ctx, cmd)
	}
	stamps := s.stampsCmd(ctx, d.Tenant)
	err := s.trips.doGroup(ctx, stamps, []redis.Cmder{cmd})
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errLeftInFlight)) {
		return err // the group was never answered
	}
	if got, serr := stampsReply(stamps); serr != nil || got != d.Stamps {
		d.Settle(engine.FusedStale)
		return engine.ErrFusedStale
	}
	d.Settle(engine.FusedChecked)
	return cmd.Err()
}
