package telemetry

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/lua"
)

// LatencyBuckets are the upper bounds (seconds) of the Redis and Postgres
// latency histograms: a script answers in tens of microseconds, a
// persister batch in tens of milliseconds.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}

// RedisMetrics times every command of a go-redis client by operation (the
// command, or "script:<file>" for creditd's scripts, or "pipeline") and
// counts the error replies of creditd's scripts by script and code.
type RedisMetrics struct {
	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	// ops caches the histogram child of each operation (string ->
	// prometheus.Observer) and scripts each script's (file name ->
	// *scriptMetrics): a command costs two clock reads and a map look-up,
	// never a label hash or an allocation.
	ops     sync.Map
	scripts sync.Map
}

// scriptMetrics is one script's latency child and error counters.
type scriptMetrics struct {
	duration prometheus.Observer
	name     string
	codes    sync.Map // error code -> prometheus.Counter
}

// NewRedisMetrics registers the Redis families on reg.
func NewRedisMetrics(reg prometheus.Registerer) *RedisMetrics {
	m := &RedisMetrics{
		duration: Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "creditd_redis_command_duration_seconds",
			Help:    "Redis round trips of the API's client, by operation (command, script:<name>, or pipeline).",
			Buckets: LatencyBuckets,
		}, []string{"op"})),
		errors: Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "creditd_redis_script_errors_total",
			Help: "Error replies of creditd's Redis scripts, by script and code (NOSTATE, INSUFFICIENT, ...; io for a network failure).",
		}, []string{"script", "code"})),
	}
	// Every script's NOSTATE series exists from the start (the reply that
	// sends a customer's state to be reloaded from Postgres).
	for _, name := range lua.LibraryScriptNames() {
		m.script(name)
		m.errors.WithLabelValues(name, "NOSTATE")
	}
	return m
}

// Hook is the go-redis hook that feeds m.
func (m *RedisMetrics) Hook() redis.Hook { return redisHook{m} }

type redisHook struct{ m *RedisMetrics }

// DialHook implements redis.Hook; dials are not timed.
func (h redisHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook implements redis.Hook.
func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		d := time.Since(start).Seconds()
		if name, ok := lua.ScriptName(cmd.Args()); ok {
			sm := h.m.script(name)
			sm.duration.Observe(d)
			// The error is next's answer: go-redis sets it on cmd only
			// after the hooks return.
			h.m.scriptError(sm, err)
			return err
		}
		h.m.op(cmd.Name()).Observe(d)
		return err
	}
}

// ProcessPipelineHook implements redis.Hook: one observation per round
// trip, and for every script in it the round trip's time (what its caller
// waited: concurrent requests' scripts share pipelines, lua's coalescer)
// and its error.
func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		d := time.Since(start).Seconds()
		h.m.op("pipeline").Observe(d)
		for _, cmd := range cmds {
			name, ok := lua.ScriptName(cmd.Args())
			if !ok {
				continue
			}
			sm := h.m.script(name)
			sm.duration.Observe(d)
			if cmd.Err() != nil {
				h.m.scriptError(sm, cmd.Err())
			}
		}
		return err
	}
}

func (m *RedisMetrics) op(name string) prometheus.Observer {
	if o, ok := m.ops.Load(name); ok {
		return o.(prometheus.Observer)
	}
	o, _ := m.ops.LoadOrStore(name, m.duration.WithLabelValues(name))
	return o.(prometheus.Observer)
}

func (m *RedisMetrics) script(name string) *scriptMetrics {
	if sm, ok := m.scripts.Load(name); ok {
		return sm.(*scriptMetrics)
	}
	sm, _ := m.scripts.LoadOrStore(name, &scriptMetrics{name: name, duration: m.duration.WithLabelValues("script:" + name)})
	return sm.(*scriptMetrics)
}

// scriptError counts err (nil and redis.Nil are no errors) under its code.
func (m *RedisMetrics) scriptError(sm *scriptMetrics, err error) {
	if err == nil || err == redis.Nil {
		return
	}
	code := "io"
	if rerr, ok := err.(redis.Error); ok {
		code = errorCode(rerr.Error())
	}
	if c, ok := sm.codes.Load(code); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c, _ := sm.codes.LoadOrStore(code, m.errors.WithLabelValues(sm.name, code))
	c.(prometheus.Counter).Inc()
}

// errorCode is the first word of a Redis error reply when it looks like a
// code (upper-case letters and underscores, at most 24), else OTHER: a
// label value must come from a small fixed set.
func errorCode(msg string) string {
	end := 0
	for end < len(msg) && msg[end] != ' ' {
		ch := msg[end]
		if (ch < 'A' || ch > 'Z') && ch != '_' {
			return "OTHER"
		}
		end++
	}
	if end == 0 || end > 24 {
		return "OTHER"
	}
	return msg[:end]
}
