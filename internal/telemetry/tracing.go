package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Tracing is an OpenTelemetry tracer provider exporting over OTLP/HTTP,
// and the W3C propagator that reads an incoming traceparent.
type Tracing struct {
	// Provider makes the tracers of the API, Redis and Postgres.
	Provider trace.TracerProvider
	// Propagator reads traceparent, tracestate and baggage.
	Propagator propagation.TextMapPropagator
	shutdown   func(context.Context) error
}

// LogErrors sends the OpenTelemetry SDK's own errors (a failed export,
// say) to log instead of the standard library's logger.
func LogErrors(log zerolog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn().Err(err).Msg("tracing")
	}))
}

// TracingFromEnv sets tracing up from the standard OTEL_* variables; it
// returns nil (tracing off, the default) unless OTEL_TRACES_EXPORTER is
// "otlp", or is unset while OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set. OTEL_SDK_DISABLED=true turns
// it off. The exporter reads the endpoint, headers, timeout, compression
// and certificates from OTEL_EXPORTER_OTLP_*; the SDK reads the sampler
// (OTEL_TRACES_SAMPLER) and batching (OTEL_BSP_*); the resource reads
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES. Only the http/protobuf
// protocol is built in: another is an error naming the variable.
func TracingFromEnv(ctx context.Context, b Build) (*Tracing, error) {
	on, err := tracingWanted()
	if err != nil || !on {
		return nil, err
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(os.Getenv(name)); v != "" && v != "http/protobuf" {
			return nil, fmt.Errorf("%s is %q: creditd exports traces over http/protobuf only", name, v)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_*: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "creditd"), attribute.String("service.version", b.Version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{
		Provider:   tp,
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		shutdown:   tp.Shutdown,
	}, nil
}

// tracingWanted reads whether the OTEL_* variables ask for traces.
func tracingWanted() (bool, error) {
	if v := strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")); v != "" {
		off, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("OTEL_SDK_DISABLED is %q: it must be true or false", v)
		}
		if off {
			return false, nil
		}
	}
	switch v := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); v {
	case "none":
		return false, nil
	case "otlp":
		return true, nil
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER is %q: creditd supports otlp or none", v)
	}
}

// Shutdown exports the spans still buffered and stops the exporter; a nil
// Tracing has nothing to do.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// InstrumentRedis makes every command of rdb run under a context that
// holds a span a child span (redisotel). Commands of background work with
// no span (the sweeps, the webhook pool) start no trace of their own.
// Arguments are not recorded: they carry customer ids and amounts.
func (t *Tracing) InstrumentRedis(ctx context.Context, rdb redis.UniversalClient) error {
	opts := []redisotel.TracingOption{redisotel.WithTracerProvider(ChildOnly(t.Provider)), redisotel.WithDBStatement(false)}
	if err := redisotel.InstrumentTracing(rdb, opts...); err != nil {
		return err
	}
	// redisotel hooks a cluster's node clients as they are made: the nodes
	// the client already knows (it has pinged the cluster) are hooked here.
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error {
			return redisotel.InstrumentTracing(node, opts...)
		})
	}
	return nil
}

// ChildOnly wraps tp so its tracers start a span only under a context that
// already holds one; elsewhere Start returns the context's no-op span.
func ChildOnly(tp trace.TracerProvider) trace.TracerProvider { return childOnlyProvider{tp: tp} }

type childOnlyProvider struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

// Tracer implements trace.TracerProvider.
func (p childOnlyProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childOnlyTracer{t: p.tp.Tracer(name, opts...)}
}

type childOnlyTracer struct {
	embedded.Tracer
	t trace.Tracer
}

// Start implements trace.Tracer.
func (t childOnlyTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx)
	}
	return t.t.Start(ctx, name, opts...)
}
