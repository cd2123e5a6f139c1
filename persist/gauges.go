package persist

import (
	"context"
	"fmt"
	"time"
)

// PartitionBacklog is one outbox partition's share of the persister's work.
type PartitionBacklog struct {
	Partition int
	// Depth is how many outbox entries wait to be committed to Postgres.
	Depth int64
	// Lag is the age of the oldest of them (0 when none).
	Lag time.Duration
}

// Partitions reads every outbox partition's depth and lag, for the
// per-partition metrics; Lag is their maximum and total.
func (p *Persister) Partitions(ctx context.Context) ([]PartitionBacklog, error) {
	now := p.cfg.Clock.Now().UnixMilli()
	out := make([]PartitionBacklog, 0, p.outbox.Partitions())
	for part := range p.outbox.Partitions() {
		n, oldestMS, err := p.outbox.Backlog(ctx, part)
		if err != nil {
			return nil, fmt.Errorf("persist: backlog of partition %d: %w", part, err)
		}
		b := PartitionBacklog{Partition: part, Depth: n}
		if n > 0 && oldestMS > 0 && now > oldestMS {
			b.Lag = time.Duration(now-oldestMS) * time.Millisecond
		}
		out = append(out, b)
	}
	return out, nil
}

// WebhookBacklog counts the webhook events the delivery pool has yet to
// deliver or give up (pending, or failed and waiting for a retry), and how
// many of them are due at now. Events of tenants without a webhook URL and
// secret are not counted: they wait, unattempted, until one is configured
// (claimDueSQL), and would otherwise grow the figure with every event.
func (s *Store) WebhookBacklog(ctx context.Context, now time.Time) (waiting, due int64, err error) {
	err = s.pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE next_retry_at <= $1)
		FROM webhook_events WHERE status IN ('pending', 'failed')
			AND tenant_id IN (SELECT id FROM tenants WHERE webhook_url IS NOT NULL AND webhook_secret IS NOT NULL)`, now).Scan(&waiting, &due)
	if err != nil {
		return 0, 0, fmt.Errorf("persist: webhook backlog: %w", err)
	}
	return waiting, due, nil
}

// DueSubscriptions counts the subscriptions whose next scheduled action is
// at or before now: the scheduler's backlog.
func (s *Store) DueSubscriptions(ctx context.Context, now time.Time) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM subscriptions WHERE next_action_at <= $1`, now).Scan(&n); err != nil {
		return 0, fmt.Errorf("persist: due subscriptions: %w", err)
	}
	return n, nil
}
