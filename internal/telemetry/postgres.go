package telemetry

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// PostgresTracer is a pgx tracer (queries, batches, COPY) that times each
// one into creditd_postgres_query_duration_seconds, counts failures, and,
// with tracing on, makes it a child span of the request that ran it.
type PostgresTracer struct {
	duration [pgOps]prometheus.Observer
	errors   [pgOps]prometheus.Counter
	tracer   trace.Tracer // nil: no spans
}

// Postgres operation kinds, the op label.
const (
	pgQuery = iota
	pgBatch
	pgCopy
	pgOps
)

var pgOpNames = [pgOps]string{"query", "batch", "copy"}

// NewPostgresTracer registers the Postgres latency families on reg; tp,
// when not nil, makes spans (only under a span already in the context).
func NewPostgresTracer(reg prometheus.Registerer, tp trace.TracerProvider) *PostgresTracer {
	dur := Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "creditd_postgres_query_duration_seconds",
		Help:    "Postgres round trips, by kind (query, batch, copy).",
		Buckets: LatencyBuckets,
	}, []string{"op"}))
	errs := Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "creditd_postgres_errors_total",
		Help: "Postgres queries, batches and copies that failed, by kind.",
	}, []string{"op"}))
	t := &PostgresTracer{}
	for i, name := range pgOpNames {
		t.duration[i], t.errors[i] = dur.WithLabelValues(name), errs.WithLabelValues(name)
	}
	if tp != nil {
		t.tracer = ChildOnly(tp).Tracer("github.com/creditd/creditd/persist")
	}
	return t
}

// pgCall is one traced operation, carried in its context.
type pgCall struct {
	start time.Time
	span  trace.Span
}

type pgCallKey struct{}

func (t *PostgresTracer) start(ctx context.Context, op int, sql string) context.Context {
	c := &pgCall{start: time.Now()}
	if t.tracer != nil {
		ctx, c.span = t.tracer.Start(ctx, "postgres "+pgOpNames[op], trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("db.system.name", "postgresql")))
		if sql != "" && c.span.IsRecording() {
			c.span.SetAttributes(attribute.String("db.query.text", sql))
		}
	}
	return context.WithValue(ctx, pgCallKey{}, c)
}

func (t *PostgresTracer) end(ctx context.Context, op int, err error) {
	c, ok := ctx.Value(pgCallKey{}).(*pgCall)
	if !ok {
		return
	}
	t.duration[op].Observe(time.Since(c.start).Seconds())
	if err != nil {
		t.errors[op].Inc()
	}
	if c.span != nil {
		if err != nil {
			c.span.SetStatus(codes.Error, err.Error())
		}
		c.span.End()
	}
}

// TraceQueryStart implements pgx.QueryTracer.
func (t *PostgresTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return t.start(ctx, pgQuery, data.SQL)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (t *PostgresTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	t.end(ctx, pgQuery, data.Err)
}

// TraceBatchStart implements pgx.BatchTracer.
func (t *PostgresTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.start(ctx, pgBatch, "")
}

// TraceBatchQuery implements pgx.BatchTracer; the batch is timed whole.
func (t *PostgresTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (t *PostgresTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	t.end(ctx, pgBatch, data.Err)
}

// TraceCopyFromStart implements pgx.CopyFromTracer.
func (t *PostgresTracer) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceCopyFromStartData) context.Context {
	return t.start(ctx, pgCopy, "COPY "+data.TableName.Sanitize())
}

// TraceCopyFromEnd implements pgx.CopyFromTracer.
func (t *PostgresTracer) TraceCopyFromEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceCopyFromEndData) {
	t.end(ctx, pgCopy, data.Err)
}

var (
	_ pgx.QueryTracer    = (*PostgresTracer)(nil)
	_ pgx.BatchTracer    = (*PostgresTracer)(nil)
	_ pgx.CopyFromTracer = (*PostgresTracer)(nil)
)
