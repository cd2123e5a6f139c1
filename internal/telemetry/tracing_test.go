package telemetry

import (
	"context"
	"strings"
	"testing"
)

// TestTracingFromEnv: tracing is off unless the OTEL_* variables ask for
// it, and a value creditd cannot honour is an error naming the variable.
func TestTracingFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		on      bool
		errName string
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true, ""},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true, ""},
		{"exporter otlp", map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, ""},
		{"exporter none", map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, false, ""},
		{"sdk disabled", map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"}, false, ""},
		{"bad exporter", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, "OTEL_TRACES_EXPORTER"},
		{"bad disabled", map[string]string{"OTEL_SDK_DISABLED": "yes"}, false, "OTEL_SDK_DISABLED"},
		{"grpc", map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, false, "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
				"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
				t.Setenv(k, tc.env[k])
			}
			tr, err := TracingFromEnv(context.Background(), Build{Version: "v", Commit: "c"})
			if tc.errName != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errName) {
					t.Fatalf("err = %v, want one naming %s", err, tc.errName)
				}
				return
			}
			if err != nil || (tr != nil) != tc.on {
				t.Fatalf("tracing = %v, err %v; want on %v", tr, err, tc.on)
			}
			_ = tr.Shutdown(context.Background())
		})
	}
}

// TestChildOnly: the wrapped tracer starts no span without a parent.
func TestChildOnly(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
	tr, err := TracingFromEnv(context.Background(), Build{})
	if err != nil || tr == nil {
		t.Fatal(tr, err)
	}
	defer func() { _ = tr.Shutdown(context.Background()) }()
	child := ChildOnly(tr.Provider).Tracer("test")
	if _, s := child.Start(context.Background(), "orphan"); s.SpanContext().IsValid() {
		t.Fatalf("a span without a parent was started")
	}
	ctx, parent := tr.Provider.Tracer("test").Start(context.Background(), "parent")
	_, s := child.Start(ctx, "child")
	if !s.SpanContext().IsValid() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Fatalf("child span %v under %v", s.SpanContext(), parent.SpanContext())
	}
}
