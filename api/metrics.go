package api

import (
	"bufio"
	"io"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// durationBuckets are the upper bounds of the request duration histogram;
// fixed so observing is a short scan and a few atomic adds.
var durationBuckets = [...]time.Duration{
	250 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond,
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
	2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
}

// Status codes counted per route; anything outside lands on 0 and is skipped.
const (
	minStatus = 100
	maxStatus = 599
)

// routeMetrics counts one route and method: lock-free, allocation-free.
type routeMetrics struct {
	route, method string
	byStatus      [maxStatus - minStatus + 1]atomic.Uint64
	buckets       [len(durationBuckets)]atomic.Uint64 // non-cumulative
	count         atomic.Uint64
	sumNanos      atomic.Uint64
}

func (m *routeMetrics) observe(status int, d time.Duration) {
	if status >= minStatus && status <= maxStatus {
		m.byStatus[status-minStatus].Add(1)
	}
	for i, ub := range durationBuckets {
		if d <= ub {
			m.buckets[i].Add(1)
			break
		}
	}
	m.count.Add(1)
	m.sumNanos.Add(uint64(max(d, 0)))
}

// httpMetrics holds every route's counters and the in-flight gauge.
type httpMetrics struct {
	mu        sync.Mutex // guards routes during registration only
	routes    []*routeMetrics
	unmatched map[string]*routeMetrics
	inFlight  atomic.Int64
}

// unmatchedMethods label requests no route matched; any other method is OTHER.
var unmatchedMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "OTHER"}

func newHTTPMetrics() *httpMetrics {
	m := &httpMetrics{unmatched: map[string]*routeMetrics{}}
	for _, meth := range unmatchedMethods {
		m.unmatched[meth] = m.route("unmatched", meth)
	}
	return m
}

// route registers the counters of one route and method.
func (m *httpMetrics) route(path, method string) *routeMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	rm := &routeMetrics{route: path, method: method}
	m.routes = append(m.routes, rm)
	return rm
}

// unmatchedFor is the counter set of an unrouted request's method. The map
// is read-only after construction and the []byte-keyed lookup does not allocate.
func (m *httpMetrics) unmatchedFor(method []byte) *routeMetrics {
	if rm, ok := m.unmatched[string(method)]; ok {
		return rm
	}
	return m.unmatched["OTHER"]
}

// write renders the Prometheus text exposition format.
func (m *httpMetrics) write(w io.Writer) {
	m.mu.Lock()
	routes := append([]*routeMetrics(nil), m.routes...)
	m.mu.Unlock()
	sort.SliceStable(routes, func(i, j int) bool {
		if routes[i].route != routes[j].route {
			return routes[i].route < routes[j].route
		}
		return routes[i].method < routes[j].method
	})
	bw := bufio.NewWriter(w)
	bw.WriteString("# HELP creditd_http_requests_total HTTP requests answered, by route template, method and status.\n")
	bw.WriteString("# TYPE creditd_http_requests_total counter\n")
	for _, rm := range routes {
		for i := range rm.byStatus {
			n := rm.byStatus[i].Load()
			if n == 0 {
				continue
			}
			bw.WriteString("creditd_http_requests_total{")
			writeLabels(bw, rm)
			bw.WriteString(`,status="`)
			bw.WriteString(strconv.Itoa(i + minStatus))
			bw.WriteString(`"} `)
			bw.WriteString(strconv.FormatUint(n, 10))
			bw.WriteByte('\n')
		}
	}
	bw.WriteString("# HELP creditd_http_request_duration_seconds Time from request read to response ready, by route template and method.\n")
	bw.WriteString("# TYPE creditd_http_request_duration_seconds histogram\n")
	for _, rm := range routes {
		count := rm.count.Load()
		if count == 0 {
			continue
		}
		var cum uint64
		for i, ub := range durationBuckets {
			cum += rm.buckets[i].Load()
			writeBucket(bw, rm, strconv.FormatFloat(ub.Seconds(), 'g', -1, 64), cum)
		}
		writeBucket(bw, rm, "+Inf", count)
		bw.WriteString("creditd_http_request_duration_seconds_sum{")
		writeLabels(bw, rm)
		bw.WriteString("} ")
		bw.WriteString(strconv.FormatFloat(float64(rm.sumNanos.Load())/1e9, 'g', -1, 64))
		bw.WriteString("\ncreditd_http_request_duration_seconds_count{")
		writeLabels(bw, rm)
		bw.WriteString("} ")
		bw.WriteString(strconv.FormatUint(count, 10))
		bw.WriteByte('\n')
	}
	bw.WriteString("# HELP creditd_http_requests_in_flight HTTP requests being served now.\n")
	bw.WriteString("# TYPE creditd_http_requests_in_flight gauge\n")
	bw.WriteString("creditd_http_requests_in_flight ")
	bw.WriteString(strconv.FormatInt(m.inFlight.Load(), 10))
	bw.WriteByte('\n')
	_ = bw.Flush()
}

func writeBucket(bw *bufio.Writer, rm *routeMetrics, le string, n uint64) {
	bw.WriteString("creditd_http_request_duration_seconds_bucket{")
	writeLabels(bw, rm)
	bw.WriteString(`,le="`)
	bw.WriteString(le)
	bw.WriteString(`"} `)
	bw.WriteString(strconv.FormatUint(n, 10))
	bw.WriteByte('\n')
}

// writeLabels writes route and method; both come from our own route table,
// so they hold no quote, backslash or newline to escape.
func writeLabels(bw *bufio.Writer, rm *routeMetrics) {
	bw.WriteString(`route="`)
	bw.WriteString(rm.route)
	bw.WriteString(`",method="`)
	bw.WriteString(rm.method)
	bw.WriteByte('"')
}
