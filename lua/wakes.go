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

// Compile-time check that Store carries the feeds' wakes.
var _ engine.FeedWakes = (*Store)(nil)

// wakeChannel is the fleet's pub/sub channel of change feed wakes. Pub/sub
// ignores databases, so the prefix keeps fleets on one Redis apart. On a
// Cluster a PUBLISH reaches the subscribers of every node (the cluster bus
// broadcasts it), so one channel serves every tenant, whatever its slot.
func (s *Store) wakeChannel() string {
	return s.prefix + ":feeds:wake"
}

// Wake messages are a letter for the source, a colon, and tenant ids
// separated by commas: "e:<id>,<id>" (events committed, the persister)
// or "c:<id>" (a config change or reservation notice, stamp.lua and
// reservation_note.lua).
const (
	wakeEventsTag  = "e"
	wakeChangesTag = "c"
	// wakeTenantsPerMessage bounds a message's size (~37 bytes a tenant).
	wakeTenantsPerMessage = 256
)

// wakeChangesMessage is the wake of tenant's change feed (stamp.lua and
// reservation_note.lua publish it).
func wakeChangesMessage(tenant uuid.UUID) string {
	return wakeChangesTag + ":" + tenant.String()
}

// PublishWakes implements engine.FeedWakes: one PUBLISH per
// wakeTenantsPerMessage tenants, pipelined.
func (s *Store) PublishWakes(ctx context.Context, what engine.FeedWake, tenants []uuid.UUID) error {
	if len(tenants) == 0 {
		return nil
	}
	tags := make([]string, 0, 2)
	if what&engine.WakeEvents != 0 {
		tags = append(tags, wakeEventsTag)
	}
	if what&engine.WakeChanges != 0 {
		tags = append(tags, wakeChangesTag)
	}
	var b strings.Builder
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, tag := range tags {
			for i := 0; i < len(tenants); i += wakeTenantsPerMessage {
				b.Reset()
				b.WriteString(tag)
				b.WriteByte(':')
				for j, t := range tenants[i:min(len(tenants), i+wakeTenantsPerMessage)] {
					if j > 0 {
						b.WriteByte(',')
					}
					b.WriteString(t.String())
				}
				p.Publish(ctx, s.wakeChannel(), b.String())
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lua: publish change feed wakes: %w", err)
	}
	return nil
}

// FollowWakes implements engine.FeedWakes with one SUBSCRIBE, which
// go-redis renews after a lost connection (then calling resumed again).
func (s *Store) FollowWakes(ctx context.Context, wake func(engine.FeedWake, uuid.UUID), resumed func()) error {
	ps := s.rdb.Subscribe(ctx, s.wakeChannel())
	defer ps.Close()
	// A wake costs the loop below a map look-up, so a deep buffer only
	// absorbs bursts; what go-redis drops after a long stall the polls
	// cover.
	ch := ps.ChannelWithSubscriptions(redis.WithChannelSize(4096))
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-ch:
			if !ok {
				return errors.New("lua: change feed wake subscription closed")
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					resumed()
				}
			case *redis.Message:
				parseWake(m.Payload, wake)
			}
		}
	}
}

// parseWake calls wake for each tenant of a wake message; what it cannot
// read it skips (a newer node's format: the poll covers it).
func parseWake(payload string, wake func(engine.FeedWake, uuid.UUID)) {
	tag, ids, ok := strings.Cut(payload, ":")
	if !ok {
		return
	}
	var what engine.FeedWake
	switch tag {
	case wakeEventsTag:
		what = engine.WakeEvents
	case wakeChangesTag:
		what = engine.WakeChanges
	default:
		return
	}
	for ids != "" {
		var id string
		id, ids, _ = strings.Cut(ids, ",")
		if t, err := uuid.Parse(id); err == nil {
			wake(what, t)
		}
	}
}
