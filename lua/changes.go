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

// Compile-time checks that Store keeps the tenants' change feeds.
var (
	_ engine.ChangeFeed       = (*Store)(nil)
	_ engine.ReservationNotes = (*Store)(nil)
)

var (
	//go:embed reservation_note.lua
	reservationNoteLua string
	// A body of the library, which a fused door's money script also runs
	// (door_fused.lua); it trims with the prelude's feed_trim.
	reservationNoteScript = newScript("reservation_note", reservationNoteLua)
)

// ReservationNote appends a reservation notice of customer c to its tenant's change
// feed, with one call of reservation_note.lua.
func (s *Store) ReservationNote(ctx context.Context, c engine.CustomerKey) error {
	err := s.call(ctx, reservationNoteScript, []string{s.stampsKey(c.TenantID), s.changesKey(c.TenantID)},
		s.appendNoteArgs(make([]any, 0, 6), &c)...).Err()
	if err != nil {
		return fmt.Errorf("lua: reservation notice: %w", err)
	}
	return nil
}

// feedTrimEvery is how many of a node's reservation notices pass between
// two that check the feed's length (reservation_note.lua): the feed may
// hold a few entries past its 1.1x cap (at most this many a node) until
// the next check trims it.
const feedTrimEvery = 8

// appendNoteArgs appends reservation_note.lua's arguments for a notice of
// customer c: the cap on one notice in feedTrimEvery, and the stamp from
// this node's clock.
func (s *Store) appendNoteArgs(a []any, c *engine.CustomerKey) []any {
	feedCap := 0
	if s.notes.Add(1)%feedTrimEvery == 0 {
		feedCap = engine.ChangeFeedCap
	}
	return append(a, c.CustomerID.String(), string(c.Environment), feedCap, s.wakeChannel(), wakeChangesMessage(c.TenantID),
		time.Now().UnixMicro())
}

// changesKey is tenant's change feed (issue 27): a stream stamp.lua appends
// to, capped at engine.ChangeFeedCap entries, under the stamps' hash tag.
func (s *Store) changesKey(tenant uuid.UUID) string {
	return s.tenantKey(tenant, ":changes")
}

// ChangesAfter lists up to limit of tenant's changes after cursor, oldest
// first, and whether changes after cursor are gone: trimmed off the front
// of the capped feed (the horizon stamp.lua keeps), or lost with a Redis
// that restarted empty (cursor not zero and no feed). Two commands in one
// MULTI, so the horizon and the entries are of one moment.
func (s *Store) ChangesAfter(ctx context.Context, tenant uuid.UUID, after engine.ChangeID, limit int) ([]engine.ConfigChange, bool, error) {
	var rng *redis.XMessageSliceCmd
	var horizon *redis.StringCmd
	var exists *redis.IntCmd
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		horizon = p.HGet(ctx, s.stampsKey(tenant), "x")
		exists = p.Exists(ctx, s.changesKey(tenant))
		rng = p.XRangeN(ctx, s.changesKey(tenant), "("+after.String(), "+", int64(limit))
		return nil
	})
	if err != nil && err != redis.Nil {
		return nil, false, fmt.Errorf("lua: read change feed: %w", err)
	}
	// A zero cursor is before every change, the trimmed ones too.
	if h, err := horizon.Result(); err == nil {
		hid, perr := engine.ParseChangeID(h)
		if perr == nil && after.Less(hid) {
			return nil, true, nil
		}
	}
	if !after.IsZero() && exists.Val() == 0 {
		return nil, true, nil
	}
	msgs, err := rng.Result()
	if err != nil && err != redis.Nil {
		return nil, false, fmt.Errorf("lua: read change feed: %w", err)
	}
	out := make([]engine.ConfigChange, 0, len(msgs))
	for _, m := range msgs {
		c, err := changeOf(m)
		if err != nil {
			return nil, false, err
		}
		out = append(out, c)
	}
	return out, false, nil
}

// ChangesLast is the id of tenant's newest change (zero when it has none).
func (s *Store) ChangesLast(ctx context.Context, tenant uuid.UUID) (engine.ChangeID, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, s.changesKey(tenant), "+", "-", 1).Result()
	if err != nil && err != redis.Nil {
		return engine.ChangeID{}, fmt.Errorf("lua: read change feed: %w", err)
	}
	if len(msgs) == 0 {
		return engine.ChangeID{}, nil
	}
	return engine.ParseChangeID(msgs[0].ID)
}

// changeOf reads one entry stamp.lua appended.
func changeOf(m redis.XMessage) (engine.ConfigChange, error) {
	id, err := engine.ParseChangeID(m.ID)
	if err != nil {
		return engine.ConfigChange{}, err
	}
	raw, _ := m.Values["stamp"].(string)
	stamp, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		return engine.ConfigChange{}, fmt.Errorf("lua: change feed entry %s: stamp %q: %w", m.ID, raw, err)
	}
	field, _ := m.Values["kind"].(string)
	if field == "h" { // reservation_note.lua
		cs, _ := m.Values["customer"].(string)
		cust, err := uuid.Parse(cs)
		if err != nil {
			return engine.ConfigChange{}, fmt.Errorf("lua: change feed entry %s: customer %q: %w", m.ID, cs, err)
		}
		env, _ := m.Values["env"].(string)
		return engine.ConfigChange{ID: id, Stamp: stamp, Customer: &cust, Environment: engine.Environment(env)}, nil
	}
	kind, ok := engine.StampKindOf(field)
	if !ok {
		return engine.ConfigChange{}, fmt.Errorf("lua: change feed entry %s: unknown kind %q", m.ID, field)
	}
	return engine.ConfigChange{ID: id, Kind: kind, Stamp: stamp}, nil
}
