// Package telemetry is creditd's metrics and tracing plumbing: the
// Prometheus registry with the runtime and build collectors, the Redis hook
// and Postgres tracer that time every command and query, the pool
// collectors, the separate metrics listener, and the OpenTelemetry set-up
// read from the standard OTEL_* variables.
package telemetry

import (
	"errors"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Build names the running binary in creditd_build_info.
type Build struct {
	Version string
	Commit  string
}

// BuildFromBinary reads the module version and VCS revision the Go
// toolchain stamped into the binary ("devel" and "unknown" when absent,
// as in `go run` or a -buildvcs=false build).
func BuildFromBinary() Build {
	b := Build{Version: "devel", Commit: "unknown"}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		b.Version = v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && s.Value != "" {
			b.Commit = s.Value
		}
	}
	return b
}

// NewRegistry is a registry holding the Go runtime and process collectors
// and creditd_build_info; every other creditd family registers on it.
func NewRegistry(b Build) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "creditd_build_info",
			Help:        "Always 1; the labels name the running creditd's version and commit.",
			ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit},
		}, func() float64 { return 1 }),
	)
	return reg
}

// Register registers c on reg, or returns the collector already there
// under the same descriptors (two servers or apps on one registry in
// tests); any other refusal is a programming error and panics.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
