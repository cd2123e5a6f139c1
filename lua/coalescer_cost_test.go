package lua

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// TestCoalescerCost (COALESCE_COST=1) measures what the coalescer saves:
// 128 goroutines run claim + consume, then checks, against a private
// redis-server, with the coalescer off and on alternately, and the test
// prints this process's and redis-server's CPU per operation of each run.
func TestCoalescerCost(t *testing.T) {
	if os.Getenv("COALESCE_COST") == "" {
		t.Skip("set COALESCE_COST=1 to measure")
	}
	ctx := context.Background()
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStore(rdb, "cost")
	const customers, workers = 1000, 128
	run := 3 * time.Second
	if d, err := time.ParseDuration(os.Getenv("COALESCE_COST_RUN")); err == nil {
		run = d
	}
	cs := make([]engine.CustomerKey, customers)
	for i := range cs {
		cs[i] = newCustomer()
		if ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: cs[i].TenantID, CustomerID: cs[i].CustomerID, Environment: cs[i].Environment}, t0); err != nil || !ok {
			t.Fatalf("load: %v %v", ok, err)
		}
		g := grantCmd(cs[i], 1<<40, t0.Add(-time.Minute))
		if _, err := s.Grant(ctx, g); err != nil {
			t.Fatalf("grant: %v", err)
		}
	}
	terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
	ops := map[string]func(i int) error{
		"claim+consume": func(i int) error {
			c := cs[i%customers]
			key := uuid.NewString()
			if _, _, err := s.Begin(ctx, c.TenantID, key, "h", time.Minute); err != nil {
				return err
			}
			cmd := consumeCmd(c, 1, terms, engine.OveragePolicyBlock, t0)
			cmd.IdempotencyKey, cmd.RequestHash = key, "h"
			_, err := s.Consume(ctx, cmd)
			return err
		},
		"check": func(i int) error {
			_, err := s.Balances(ctx, cs[i%customers], t0)
			return err
		},
	}
	for _, name := range []string{"claim+consume", "check"} {
		for round := 0; round < 4; round++ {
			s.trips.off = round%2 == 0
			var n atomic.Int64
			var wg sync.WaitGroup
			self0, redis0 := selfCPU(), redisCPU(t, rdb)
			end := time.Now().Add(run)
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; time.Now().Before(end); i += workers {
						if err := ops[name](i); err != nil {
							t.Errorf("%s: %v", name, err)
							return
						}
						n.Add(1)
					}
				}()
			}
			wg.Wait()
			self, red := selfCPU()-self0, redisCPU(t, rdb)-redis0
			k := float64(n.Load())
			fmt.Printf("%-14s coalescer on=%-5v %7.0f ops/s  creditd %6.1f µs/op  redis %6.1f µs/op\n",
				name, !s.trips.off, k/run.Seconds(), float64(self.Microseconds())/k, float64(red.Microseconds())/k)
		}
	}
}

// selfCPU is this process's user + system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU is the server's used_cpu_sys + used_cpu_user.
func redisCPU(t *testing.T, rdb *redis.Client) time.Duration {
	info, err := rdb.Info(context.Background(), "cpu").Result()
	if err != nil {
		t.Fatalf("info cpu: %v", err)
	}
	var total float64
	for _, line := range strings.Split(info, "\r\n") {
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_sys" || k == "used_cpu_user" {
			f, _ := strconv.ParseFloat(v, 64)
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}
