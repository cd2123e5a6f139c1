package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// RebuildResult is the timing of `creditd rebuild` over accounts seeded
// straight into Postgres.
type RebuildResult struct {
	Customers         int       `json:"customers"`
	BlocksPerCustomer int       `json:"blocks_per_customer"`
	SeedSeconds       float64   `json:"seed_seconds"`
	Seconds           float64   `json:"rebuild_seconds"`
	AccountsPerSecond float64   `json:"accounts_per_second"`
	Output            string    `json:"output"`
	RedisBytesBefore  int64     `json:"redis_used_memory_before"`
	RedisBytesAfter   int64     `json:"redis_used_memory_after"`
	BytesPerCustomer  float64   `json:"redis_bytes_per_customer"`
	SampleKeyBytes    int64     `json:"sample_account_key_bytes"`
	KeysLoaded        int64     `json:"keys_loaded"`
	CPU               CPUSample `json:"cpu_seconds"`
	TimedOut          bool      `json:"timed_out,omitempty"`
	Done              int64     `json:"accounts_rebuilt"`
	Error             string    `json:"error,omitempty"`
}

var progressRe = regexp.MustCompile(`rebuild: ([0-9]+)/[0-9]+ accounts`)

// lastProgress is the account count of creditd rebuild's last progress line.
func lastProgress(s string) int64 {
	m := progressRe.FindAllStringSubmatch(s, -1)
	if len(m) == 0 {
		return 0
	}
	v, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return v
}

// seedAccounts COPYs n accounts with 3 live blocks each into the credit
// tables (the persister's tables, the rebuild's source), as if the
// persister had written them: version 3, balance the blocks' sum.
func seedAccounts(ctx context.Context, dbURL string, n int) (sample uuid.UUID, err error) {
	// Seeding COPYs are long on a busy machine: no statement timeout here
	// (persist.Open's default would stop them).
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	pool, err := persist.Open(ctx, dbURL+sep+"statement_timeout=0")
	if err != nil {
		return uuid.Nil, err
	}
	defer pool.Close()
	if err := persist.Migrate(ctx, pool); err != nil {
		return uuid.Nil, err
	}
	tenant := uuid.New()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	id := func() uuid.UUID {
		var u uuid.UUID
		hi, lo := rng.Uint64(), rng.Uint64()
		for i := 0; i < 8; i++ {
			u[i], u[8+i] = byte(hi>>(8*i)), byte(lo>>(8*i))
		}
		u[6] = u[6]&0x0f | 0x40 // version 4
		u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
		return u
	}
	now := time.Now().UTC()
	expires := now.Add(90 * 24 * time.Hour)
	const chunk = 20_000
	for done := 0; done < n; done += chunk {
		m := min(chunk, n-done)
		accounts := make([][]any, 0, m)
		blocks := make([][]any, 0, 3*m)
		for i := 0; i < m; i++ {
			c := id()
			if done == 0 && i == 0 {
				sample = c
			}
			amounts := []int64{500_000, 1_000_000, 2_000_000}
			var sum int64
			for k, a := range amounts {
				var exp any
				if k == 0 {
					exp = expires
				}
				blocks = append(blocks, []any{id(), tenant, c, a, a, int32(k), "migration", now, exp, now, "{}", int64(3)})
				sum += a
			}
			accounts = append(accounts, []any{c, id(), tenant, "live", sum, int64(0), int64(0), sum, int64(3), now})
		}
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{"credit_accounts"},
			[]string{"customer_id", "id", "tenant_id", "environment", "balance", "reserved_balance", "pending_balance",
				"lifetime_earned", "version", "updated_at"}, pgx.CopyFromRows(accounts)); err != nil {
			return uuid.Nil, fmt.Errorf("copy credit_accounts: %w", err)
		}
		if _, err := pool.CopyFrom(ctx, pgx.Identifier{"credit_blocks"},
			[]string{"id", "tenant_id", "customer_id", "original_amount", "remaining_amount", "priority", "source",
				"starts_at", "expires_at", "created_at", "metadata", "version"}, pgx.CopyFromRows(blocks)); err != nil {
			return uuid.Nil, fmt.Errorf("copy credit_blocks: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE credit_accounts, credit_blocks"); err != nil {
		return uuid.Nil, err
	}
	return sample, nil
}

// runRebuild seeds n customers into a fresh database and times the creditd
// binary's rebuild into a fresh key prefix; the keys are deleted afterwards.
func runRebuild(ctx context.Context, bin, baseDB, dbName, redisURL string, rdb *redis.Client, n int, timeout time.Duration, probe *CPUProbe, logf func(string, ...any)) RebuildResult {
	out := RebuildResult{Customers: n, BlocksPerCustomer: 3}
	fail := func(err error) RebuildResult { out.Error = err.Error(); return out }
	dbURL, err := createDatabase(ctx, baseDB, dbName)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err := dropDatabase(context.Background(), baseDB, dbName); err != nil {
			logf("drop database %s: %v", dbName, err)
		}
	}()
	logf("rebuild: seeding %d accounts with 3 blocks each into Postgres (COPY)", n)
	t0 := time.Now()
	sample, err := seedAccounts(ctx, dbURL, n)
	if err != nil {
		return fail(err)
	}
	out.SeedSeconds = time.Since(t0).Seconds()
	prefix := dbName
	defer func() {
		if k, err := deletePrefix(context.Background(), rdb, prefix); err != nil {
			logf("delete rebuild keys: %v", err)
		} else {
			logf("rebuild: deleted %d keys", k)
		}
	}()
	if out.RedisBytesBefore, err = redisUsedMemory(ctx, rdb); err != nil {
		return fail(err)
	}
	logf("rebuild: seeded in %.1fs; running creditd rebuild", out.SeedSeconds)
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(rctx, bin, "rebuild")
	// On timeout creditd gets SIGTERM and stops between pages.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = append(os.Environ(), "REDIS_URL="+redisURL, "DATABASE_URL="+dbURL, "CREDITD_REDIS_PREFIX="+prefix, "LOG_LEVEL=warn")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	before := probe.Sample()
	t1 := time.Now()
	err = cmd.Run()
	out.Seconds = time.Since(t1).Seconds()
	out.CPU = probe.Sample().Sub(before)
	if cmd.ProcessState != nil {
		out.CPU["creditd rebuild"] = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	}
	out.Output = strings.TrimSpace(stdout.String())
	if err != nil && rctx.Err() != nil && ctx.Err() == nil {
		// Timed out: report the rate it reached from its last progress line.
		done := lastProgress(stderr.String())
		out.TimedOut = true
		out.Done = done
		out.AccountsPerSecond = float64(done) / out.Seconds
		out.Output = fmt.Sprintf("stopped after %s: %d of %d accounts rebuilt", timeout, done, n)
		logf("rebuild: %s", out.Output)
	} else if err != nil {
		return fail(fmt.Errorf("creditd rebuild: %v: %s", err, lastLines(stderr.String()+stdout.String(), 3)))
	} else {
		out.Done = int64(n)
		out.AccountsPerSecond = float64(n) / out.Seconds
	}
	if out.RedisBytesAfter, err = redisUsedMemory(ctx, rdb); err != nil {
		return fail(err)
	}
	if out.Done > 0 {
		out.BytesPerCustomer = float64(out.RedisBytesAfter-out.RedisBytesBefore) / float64(out.Done)
	}
	key := accountKey(prefix, sample)
	out.SampleKeyBytes, _ = rdb.MemoryUsage(ctx, key).Result()
	out.KeysLoaded, _ = countKeys(ctx, rdb, "{"+prefix+":*:a:*")
	return out
}

// accountKey is the Redis hash of a customer (lua/store.go's layout).
func accountKey(prefix string, customer uuid.UUID) string {
	return fmt.Sprintf("{%s:p%02d}:a:%s", prefix, lua.Partition(customer), customer)
}

func countKeys(ctx context.Context, rdb *redis.Client, pattern string) (int64, error) {
	var n int64
	iter := rdb.Scan(ctx, 0, pattern, 10000).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}
