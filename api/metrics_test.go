package api

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRouteMetricsObserve: a request lands in its status class and the
// histogram, without allocating; a status outside 1xx-5xx is timed only.
func TestRouteMetricsObserve(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newHTTPMetrics(reg)
	rm := m.route("/v1/x", "GET")
	for _, st := range []int{200, 201, 404, 503, 99, 600} {
		rm.observe(st, time.Millisecond)
	}
	for class, want := range map[string]float64{"2xx": 2, "4xx": 1, "5xx": 1, "1xx": 0, "3xx": 0} {
		if got := testutil.ToFloat64(m.requests.WithLabelValues("/v1/x", "GET", class)); got != want {
			t.Errorf("status %s = %v, want %v", class, got, want)
		}
	}
	if n := testutil.CollectAndCount(m.duration, "creditd_http_request_duration_seconds"); n != 1+len(unmatchedMethods) {
		t.Errorf("%d duration series, want %d", n, 1+len(unmatchedMethods))
	}
	if allocs := testing.AllocsPerRun(1000, func() { rm.observe(200, time.Millisecond) }); allocs != 0 {
		t.Errorf("observe allocates %v times per request", allocs)
	}
	// A second server on the same registry shares the families.
	if again := newHTTPMetrics(reg); again.requests != m.requests {
		t.Errorf("second server registered new families")
	}
}
