package console

import (
	"bufio"
	"bytes"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Overview sampling: each overview request takes a sample of the server's
// own metrics when the last is at least minSampleGap old; the page reloads
// itself every refreshSeconds, so the charts fill while someone watches
// and nothing runs when nobody does.
const (
	maxSamples     = 120
	minSampleGap   = time.Second
	refreshSeconds = 5
	// maxBacklogCounted bounds the webhook backlog count: past it the
	// overview shows the bound.
	maxBacklogCounted = 10_000
)

// Route templates the overview's rates count (api's route labels).
const (
	routeCheck   = "/v1/entitlements/check"
	routeConsume = "/v1/entitlements/consume"
)

// sample is the counters of one metrics scrape.
type sample struct {
	at                     time.Time
	requests, checks, cons float64
	// buckets is the duration histogram summed over routes: upper bound
	// (seconds) -> cumulative count.
	buckets map[float64]float64
	// gauges are the single-valued gauges by name (persister lag, backlog,
	// dead letters, webhook gauges).
	gauges map[string]float64
	// webhookBacklog is the events waiting for delivery (-1: unknown).
	webhookBacklog float64
}

// sampler keeps the last samples. Safe for concurrent use.
type sampler struct {
	mu   sync.Mutex
	ring []sample
}

func newSampler() *sampler { return &sampler{} }

// add keeps s unless the last sample is younger than minSampleGap.
func (sm *sampler) add(s sample) []sample {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if n := len(sm.ring); n == 0 || s.at.Sub(sm.ring[n-1].at) >= minSampleGap {
		sm.ring = append(sm.ring, s)
		if len(sm.ring) > maxSamples {
			sm.ring = append(sm.ring[:0], sm.ring[len(sm.ring)-maxSamples:]...)
		}
	}
	return append([]sample(nil), sm.ring...)
}

// parseMetrics reads the Prometheus text the server writes into a sample.
func parseMetrics(text []byte, at time.Time) sample {
	s := sample{at: at, buckets: map[float64]float64{}, gauges: map[string]float64{}, webhookBacklog: -1}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		name, labels := line[:sp], ""
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name, labels = name[:i], name[i:]
		}
		switch {
		case name == "creditd_http_requests_total":
			s.requests += v
			switch label(labels, "route") {
			case routeCheck:
				s.checks += v
			case routeConsume:
				s.cons += v
			}
		case name == "creditd_http_request_duration_seconds_bucket":
			le := label(labels, "le")
			b := math.Inf(1)
			if le != "+Inf" {
				if b, err = strconv.ParseFloat(le, 64); err != nil {
					continue
				}
			}
			s.buckets[b] += v
		case labels == "" && (strings.HasPrefix(name, "creditd_persister_") || strings.HasPrefix(name, "creditd_dead_letters")):
			s.gauges[name] = v
		case strings.HasPrefix(name, "creditd_webhook") && !strings.HasSuffix(name, "_bucket"):
			// Webhook backlog and delivery series, labels and all.
			s.gauges[name+labels] = v
		}
	}
	return s
}

// label is the value of name in a {a="x",b="y"} label set ("" if absent).
func label(labels, name string) string {
	i := strings.Index(labels, name+`="`)
	if i < 0 {
		return ""
	}
	rest := labels[i+len(name)+2:]
	if j := strings.IndexByte(rest, '"'); j >= 0 {
		return rest[:j]
	}
	return ""
}

// p99 is the 99th percentile upper bound (seconds) of the requests between
// a and b, from the histogram's cumulative buckets; 0 without requests. A
// p99 past the last finite bound is shown as that bound (a floor).
func p99(a, b sample) float64 {
	bounds := make([]float64, 0, len(b.buckets))
	for le := range b.buckets {
		bounds = append(bounds, le)
	}
	sort.Float64s(bounds)
	total := b.buckets[math.Inf(1)] - a.buckets[math.Inf(1)]
	if total <= 0 {
		return 0
	}
	last := 0.0
	for _, le := range bounds {
		if math.IsInf(le, 1) {
			break
		}
		if b.buckets[le]-a.buckets[le] >= 0.99*total {
			return le
		}
		last = le
	}
	return last
}

// rateChart is one overview chart.
type rateChart struct {
	Title, Unit string
	Last        string
	Chart       chart
}

// overviewView is the live overview.
type overviewView struct {
	Charts []rateChart
	Gauges []gaugeRow
	// Samples is how many scrapes the charts hold (the page fills as it
	// reloads).
	Samples int
}

type gaugeRow struct {
	Name  string
	Value string
}

// overview samples the server's metrics and draws the rates.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	var v overviewView
	if c.cfg.Metrics != nil {
		var buf bytes.Buffer
		c.cfg.Metrics(&buf)
		s := parseMetrics(buf.Bytes(), time.Now())
		if n, err := c.cfg.Directory.PendingWebhookEvents(r.Context(), maxBacklogCounted); err == nil {
			s.webhookBacklog = float64(n)
		} else {
			c.cfg.Log.Warn().Err(err).Msg("console: webhook backlog")
		}
		v = overviewOf(c.samples.add(s))
	}
	c.render(w, r, http.StatusOK, "overview", "Overview", v, refreshSeconds)
}

// overviewOf turns samples into the rate charts and the latest gauges.
func overviewOf(ring []sample) overviewView {
	v := overviewView{Samples: len(ring)}
	if len(ring) == 0 {
		return v
	}
	type series struct {
		title, unit string
		f           func(a, b sample) float64
		format      func(float64) string
	}
	rate := func(get func(sample) float64) func(a, b sample) float64 {
		return func(a, b sample) float64 {
			d := b.at.Sub(a.at).Seconds()
			if d <= 0 {
				return 0
			}
			return math.Max(0, get(b)-get(a)) / d
		}
	}
	perSec := func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
	all := []series{
		{"Checks", "per second", rate(func(s sample) float64 { return s.checks }), perSec},
		{"Consumes", "per second", rate(func(s sample) float64 { return s.cons }), perSec},
		{"All requests", "per second", rate(func(s sample) float64 { return s.requests }), perSec},
		{"p99 latency", "milliseconds, bucket bound", func(a, b sample) float64 { return p99(a, b) * 1000 },
			func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }},
		{"Persister lag", "seconds", func(_, b sample) float64 { return b.gauges["creditd_persister_lag_seconds"] },
			func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }},
		{"Webhook backlog", "events waiting", func(_, b sample) float64 { return math.Max(0, b.webhookBacklog) },
			func(f float64) string {
				if f >= maxBacklogCounted {
					return strconv.Itoa(maxBacklogCounted) + " or more"
				}
				return strconv.FormatFloat(f, 'f', 0, 64)
			}},
	}
	for _, s := range all {
		times := make([]time.Time, 0, len(ring))
		vals := make([]float64, 0, len(ring))
		for i := 1; i < len(ring); i++ {
			times = append(times, ring[i].at)
			vals = append(vals, s.f(ring[i-1], ring[i]))
		}
		rc := rateChart{Title: s.title, Unit: s.unit, Last: "—"}
		if len(vals) > 0 {
			rc.Last = s.format(vals[len(vals)-1])
		}
		rc.Chart = line(times, vals).chart
		rc.Chart.Empty = len(vals) < 2
		v.Charts = append(v.Charts, rc)
	}
	last := ring[len(ring)-1]
	for name, g := range last.gauges {
		v.Gauges = append(v.Gauges, gaugeRow{Name: name, Value: strconv.FormatFloat(g, 'f', -1, 64)})
	}
	sort.Slice(v.Gauges, func(i, j int) bool { return v.Gauges[i].Name < v.Gauges[j].Name })
	return v
}
