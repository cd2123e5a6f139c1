package lua

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store keeps the fleet-wide webhook delivery slots.
var _ engine.DeliverySlots = (*Store)(nil)

var (
	//go:embed delivery_slots.lua
	deliverySlotsLua    string
	deliverySlotsScript = redis.NewScript(deliverySlotsLua)
)

// deliverySlotsKey is the tenant's slots, under the tenant's hash tag.
func (s *Store) deliverySlotsKey(tenant uuid.UUID) string {
	return s.tenantTag(tenant) + ":wh:slots"
}

// AcquireDeliverySlot takes one of tenant's limit slots for holder until
// lease has passed, on Redis' clock (delivery_slots.lua); false when all
// are held. limit must be at least 1 and lease at least 1 ms.
func (s *Store) AcquireDeliverySlot(ctx context.Context, tenant, holder uuid.UUID, limit int, lease time.Duration) (bool, error) {
	return s.acquireDeliverySlotAt(ctx, tenant, holder, limit, lease, time.Time{})
}

// acquireDeliverySlotAt is AcquireDeliverySlot at now (zero: Redis' clock).
func (s *Store) acquireDeliverySlotAt(ctx context.Context, tenant, holder uuid.UUID, limit int, lease time.Duration, now time.Time) (bool, error) {
	if limit < 1 || lease < time.Millisecond {
		return false, fmt.Errorf("lua: delivery slot: limit %d and lease %s must be at least 1 and 1ms", limit, lease)
	}
	var nowMS int64
	if !now.IsZero() {
		nowMS = now.UnixMilli()
	}
	n, err := deliverySlotsScript.Run(ctx, s.rdb, []string{s.deliverySlotsKey(tenant)},
		holder.String(), limit, lease.Milliseconds(), nowMS).Int64()
	if err != nil {
		return false, fmt.Errorf("lua: delivery slot: %w", err)
	}
	return n == 1, nil
}

// ReleaseDeliverySlot gives holder's slot of tenant back (nothing when it
// reservations none).
func (s *Store) ReleaseDeliverySlot(ctx context.Context, tenant, holder uuid.UUID) error {
	if err := s.rdb.ZRem(ctx, s.deliverySlotsKey(tenant), holder.String()).Err(); err != nil {
		return fmt.Errorf("lua: delivery slot release: %w", err)
	}
	return nil
}
