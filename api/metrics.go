package api

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// durationBuckets are the upper bounds (seconds) of the request duration
// histogram; the bench reads its 1 ms bound.
var durationBuckets = []float64{
	0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
}

// statusClasses are the status label's values, indexed by status/100 - 1.
var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// routeMetrics is one route and method's series, resolved when the route
// is registered: observing a request is an index and two atomic adds,
// never a label look-up or an allocation.
type routeMetrics struct {
	byClass  [len(statusClasses)]prometheus.Counter
	duration prometheus.Observer
}

func (m *routeMetrics) observe(status int, d time.Duration) {
	if k := status/100 - 1; k >= 0 && k < len(m.byClass) {
		m.byClass[k].Inc()
	}
	m.duration.Observe(max(d, 0).Seconds())
}

// httpMetrics holds the RED families of every route and the in-flight gauge.
type httpMetrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	inFlight  prometheus.Gauge
	unmatched map[string]*routeMetrics
}

// unmatchedMethods label requests no route matched; any other method is OTHER.
var unmatchedMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "OTHER"}

// newHTTPMetrics registers the HTTP families on reg (or takes the ones a
// server before this one registered there).
func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "creditd_http_requests_total",
			Help: "HTTP requests answered, by route template, method and status class.",
		}, []string{"route", "method", "status"})),
		duration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "creditd_http_request_duration_seconds",
			Help:    "Time from request read to response ready, by route template and method.",
			Buckets: durationBuckets,
		}, []string{"route", "method"})),
		inFlight: register(reg, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "creditd_http_requests_in_flight",
			Help: "HTTP requests being served now.",
		})),
		unmatched: map[string]*routeMetrics{},
	}
	for _, meth := range unmatchedMethods {
		m.unmatched[meth] = m.route("unmatched", meth)
	}
	return m
}

// route resolves the series of one route and method.
func (m *httpMetrics) route(path, method string) *routeMetrics {
	rm := &routeMetrics{duration: m.duration.WithLabelValues(path, method)}
	for i, class := range statusClasses {
		rm.byClass[i] = m.requests.WithLabelValues(path, method, class)
	}
	return rm
}

// unmatchedFor is the series of an unrouted request's method. The map is
// read-only after construction and the []byte-keyed look-up does not allocate.
func (m *httpMetrics) unmatchedFor(method []byte) *routeMetrics {
	if rm, ok := m.unmatched[string(method)]; ok {
		return rm
	}
	return m.unmatched["OTHER"]
}

// register registers c on reg, or returns the collector of the same
// descriptors already there (several servers on one registry in tests).
func register[T prometheus.Collector](reg prometheus.Registerer, c T) T {
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
