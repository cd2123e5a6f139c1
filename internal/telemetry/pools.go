package telemetry

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RedisPool is a go-redis client whose pool can be read (*redis.Client
// and *redis.ClusterClient both are).
type RedisPool interface {
	PoolStats() *redis.PoolStats
}

// PoolCollector reads the Redis pools' and the Postgres pool's figures at
// each scrape (go-redis PoolStats, pgxpool Stat).
type PoolCollector struct {
	redis map[string]RedisPool
	pg    *pgxpool.Pool

	redisConns, redisHits, redisMisses, redisTimeouts *prometheus.Desc
	pgConns, pgAcquires, pgEmpty, pgCanceled, pgWait  *prometheus.Desc
}

// NewPoolCollector collects the named Redis pools and the Postgres pool
// (either may be missing: a nil pool, an empty map).
func NewPoolCollector(redisPools map[string]RedisPool, pg *pgxpool.Pool) *PoolCollector {
	pool := []string{"pool"}
	return &PoolCollector{
		redis:         redisPools,
		pg:            pg,
		redisConns:    prometheus.NewDesc("creditd_redis_pool_connections", "Connections of a Redis client pool, by state (total, idle, stale: closed since start).", []string{"pool", "state"}, nil),
		redisHits:     prometheus.NewDesc("creditd_redis_pool_hits_total", "Times a free connection was found in the Redis pool.", pool, nil),
		redisMisses:   prometheus.NewDesc("creditd_redis_pool_misses_total", "Times no free connection was in the Redis pool (a new one was dialled or waited for).", pool, nil),
		redisTimeouts: prometheus.NewDesc("creditd_redis_pool_timeouts_total", "Times a command waited for a Redis pool connection past the pool timeout.", pool, nil),
		pgConns:       prometheus.NewDesc("creditd_postgres_pool_connections", "Connections of the Postgres pool, by state (acquired, idle, constructing, total, max).", []string{"state"}, nil),
		pgAcquires:    prometheus.NewDesc("creditd_postgres_pool_acquires_total", "Successful acquisitions of a Postgres pool connection.", nil, nil),
		pgEmpty:       prometheus.NewDesc("creditd_postgres_pool_empty_acquires_total", "Acquisitions that had to wait because the Postgres pool had no idle connection.", nil, nil),
		pgCanceled:    prometheus.NewDesc("creditd_postgres_pool_canceled_acquires_total", "Acquisitions given up (context ended) while waiting for a Postgres connection.", nil, nil),
		pgWait:        prometheus.NewDesc("creditd_postgres_pool_acquire_seconds_total", "Time spent acquiring Postgres pool connections.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *PoolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.redisConns, c.redisHits, c.redisMisses, c.redisTimeouts, c.pgConns, c.pgAcquires, c.pgEmpty, c.pgCanceled, c.pgWait} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *PoolCollector) Collect(ch chan<- prometheus.Metric) {
	for name, p := range c.redis {
		s := p.PoolStats()
		ch <- prometheus.MustNewConstMetric(c.redisConns, prometheus.GaugeValue, float64(s.TotalConns), name, "total")
		ch <- prometheus.MustNewConstMetric(c.redisConns, prometheus.GaugeValue, float64(s.IdleConns), name, "idle")
		ch <- prometheus.MustNewConstMetric(c.redisConns, prometheus.GaugeValue, float64(s.StaleConns), name, "stale")
		ch <- prometheus.MustNewConstMetric(c.redisHits, prometheus.CounterValue, float64(s.Hits), name)
		ch <- prometheus.MustNewConstMetric(c.redisMisses, prometheus.CounterValue, float64(s.Misses), name)
		ch <- prometheus.MustNewConstMetric(c.redisTimeouts, prometheus.CounterValue, float64(s.Timeouts), name)
	}
	if c.pg == nil {
		return
	}
	s := c.pg.Stat()
	for state, v := range map[string]int32{
		"acquired": s.AcquiredConns(), "idle": s.IdleConns(), "constructing": s.ConstructingConns(),
		"total": s.TotalConns(), "max": s.MaxConns(),
	} {
		ch <- prometheus.MustNewConstMetric(c.pgConns, prometheus.GaugeValue, float64(v), state)
	}
	ch <- prometheus.MustNewConstMetric(c.pgAcquires, prometheus.CounterValue, float64(s.AcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.pgEmpty, prometheus.CounterValue, float64(s.EmptyAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.pgCanceled, prometheus.CounterValue, float64(s.CanceledAcquireCount()))
	ch <- prometheus.MustNewConstMetric(c.pgWait, prometheus.CounterValue, s.AcquireDuration().Seconds())
}
