package telemetry

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/lua"
)

// TestRedisHookCountsScriptErrors: a script's error reply is counted under
// its script and code, and its round trip under script:<name>.
func TestRedisHookCountsScriptErrors(t *testing.T) {
	rdb, prefix := testenv.Redis(t)
	reg := prometheus.NewRegistry()
	m := NewRedisMetrics(reg)
	rdb.AddHook(m.Hook())
	store := lua.NewStore(rdb, prefix)
	c := engine.CustomerKey{TenantID: uuid.New(), CustomerID: uuid.New(), Environment: engine.EnvironmentLive}
	for range 2 {
		if _, _, err := store.Expire(context.Background(), uuid.New(), c, time.Now()); !errors.Is(err, engine.ErrStateMissing) {
			t.Fatalf("expire of a missing customer: %v", err)
		}
	}
	if got := testutil.ToFloat64(m.errors.WithLabelValues("expire", "NOSTATE")); got != 2 {
		t.Errorf("expire NOSTATE errors = %v, want 2", got)
	}
	n, err := testutil.GatherAndCount(reg, "creditd_redis_command_duration_seconds")
	if err != nil || n == 0 {
		t.Fatalf("latency series: %d %v", n, err)
	}
	text, _ := reg.Gather()
	var found bool
	for _, mf := range text {
		for _, mm := range mf.GetMetric() {
			for _, l := range mm.GetLabel() {
				if l.GetValue() == "script:expire" && mm.GetHistogram().GetSampleCount() >= 2 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no script:expire latency samples")
	}
}

// TestErrorCode: only code-like first words become label values.
func TestErrorCode(t *testing.T) {
	for _, tc := range []struct{ msg, want string }{
		{"NOSTATE no credit state", "NOSTATE"},
		{"TOOMANYBLOCKS", "TOOMANYBLOCKS"},
		{"ERR Function not found", "ERR"},
		{"redis: connection pool timeout", "OTHER"},
		{"", "OTHER"},
		{strings.Repeat("A", 25), "OTHER"},
	} {
		if got := errorCode(tc.msg); got != tc.want {
			t.Errorf("errorCode(%q) = %q, want %q", tc.msg, got, tc.want)
		}
	}
}

// BenchmarkRedisHook is the hook's share of one script call and one
// plain command: no allocation.
func BenchmarkRedisHook(b *testing.B) {
	m := NewRedisMetrics(prometheus.NewRegistry())
	hook := m.Hook().ProcessHook(func(context.Context, redis.Cmder) error { return nil })
	ctx := context.Background()
	for _, cmd := range []redis.Cmder{redis.NewCmd(ctx, "eval", "return 1", 0), redis.NewStatusCmd(ctx, "set", "k", "v")} {
		b.Run(cmd.Name(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = hook(ctx, cmd)
			}
		})
	}
}
