package persist

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// The tables partitioned by month of created_at (migrations 033 and 034;
// issue 30 item 1, docs/decisions.md "The ledger by month"). Each has a
// DEFAULT partition, <table>_default, for a row no month reservations.
var monthPartitioned = []string{"ledger_entries", "operations"}

// PartitionMonthsAhead is how many months after the current one
// EnsurePartitions keeps created: the scheduler calls it hourly on every
// node, so a month exists two months before its first row, and a fleet
// stopped for less than that restarts with no row in DEFAULT.
const PartitionMonthsAhead = 2

// partitionLockTimeout bounds how long creating a partition waits for the
// parent's lock (held by every running read and write of the table): a
// month that cannot be made now is made at the next call, long before it
// is needed, instead of queueing the persister behind a long read.
const partitionLockTimeout = 2 * time.Second

// EnsurePartitions creates, for each month-partitioned table, the
// partitions of now's UTC month and of the PartitionMonthsAhead after it
// that do not exist yet (moving into each any row of its month that is in
// the DEFAULT partition), and returns how many it created and how many
// rows the DEFAULT partitions still hold (0 unless a row is dated beyond
// the months made: an alarm, PartitionAlarm). A table not partitioned yet
// (migration 033's contract pending) is skipped. Safe to call from every
// node at once: creators of one partition are serialized in Postgres.
func (s *Store) EnsurePartitions(ctx context.Context, now time.Time) (created int, strays int64, err error) {
	for _, table := range monthPartitioned {
		partitioned, err := s.isPartitioned(ctx, table)
		if err != nil || !partitioned {
			if err != nil {
				return created, strays, fmt.Errorf("persist: partitions of %s: %w", table, err)
			}
			continue
		}
		for i := 0; i <= PartitionMonthsAhead; i++ {
			month := time.Date(now.UTC().Year(), now.UTC().Month()+time.Month(i), 1, 0, 0, 0, 0, time.UTC)
			var made bool
			err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", partitionLockTimeout.Milliseconds())); err != nil {
					return err
				}
				return tx.QueryRow(ctx, `SELECT credit_month_partition($1, $2)`, table, month).Scan(&made)
			})
			if err != nil {
				return created, strays, fmt.Errorf("persist: partition of %s for %s: %w", table, month.Format("2006-01"), err)
			}
			if made {
				created++
			}
		}
		n, err := s.defaultRows(ctx, table)
		if err != nil {
			return created, strays, err
		}
		strays += n
	}
	return created, strays, nil
}

// PartitionAlarm counts the rows in the DEFAULT partitions of the
// month-partitioned tables, at most 1000 per table: rows dated in a month
// that has no partition (the clock of a writer far ahead, or months of
// EnsurePartitions not running). Each is moved into its month when
// EnsurePartitions creates it; meanwhile the count is shown in /readyz.
func (s *Store) PartitionAlarm(ctx context.Context) (int64, error) {
	var total int64
	for _, table := range monthPartitioned {
		partitioned, err := s.isPartitioned(ctx, table)
		if err != nil {
			return 0, fmt.Errorf("persist: partition alarm: %w", err)
		}
		if !partitioned {
			continue
		}
		n, err := s.defaultRows(ctx, table)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func (s *Store) isPartitioned(ctx context.Context, table string) (bool, error) {
	var partitioned bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p
		WHERE p.partrelid = to_regclass($1))`, table).Scan(&partitioned)
	return partitioned, err
}

func (s *Store) defaultRows(ctx context.Context, table string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 1000) d`,
		pgx.Identifier{table + "_default"}.Sanitize())).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("persist: rows in %s_default: %w", table, err)
	}
	return n, nil
}
