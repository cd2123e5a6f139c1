package app_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/creditd/creditd/internal/testenv"
)

// deployDir is the repository's deploy/ from this package's directory.
var deployDir = filepath.Join("..", "..", "deploy")

// metricNames lists the metric names a PromQL expression selects.
func metricNames(t *testing.T, p parser.Parser, expr string) []string {
	t.Helper()
	e, err := p.ParseExpr(expr)
	if err != nil {
		t.Errorf("PromQL %q: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	if len(out) == 0 {
		t.Errorf("PromQL %q selects no metric", expr)
	}
	return out
}

// served reports whether /metrics serves name: a family, or a histogram's
// _bucket, _sum or _count series.
func served(fams map[string]*familyInfo, name string) bool {
	if fams[name] != nil {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if f := fams[strings.TrimSuffix(name, suffix)]; f != nil && strings.HasSuffix(name, suffix) && (f.Type == "HISTOGRAM" || f.Type == "SUMMARY") {
			return true
		}
	}
	return false
}

// TestDeployAlertRules: deploy/prometheus/alerts.yml passes the checks of
// `promtool check rules` (rulefmt: structure, durations, label and
// annotation templates, every expression parsed), has the alerts the
// runbook relies on, and every metric it names is served on /metrics.
func TestDeployAlertRules(t *testing.T) {
	n := startNode(t, nil, nil)
	exercise(t, n.URL)
	fams := scrape(t, n.URL+"/metrics")
	p := parser.NewParser(parser.Options{})
	groups, errs := rulefmt.ParseFile(filepath.Join(deployDir, "prometheus", "alerts.yml"), false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("alerts.yml: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	alerts := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("alert %s lacks a severity label or a summary", r.Alert)
			}
			for _, name := range metricNames(t, p, r.Expr) {
				if !served(fams, name) {
					t.Errorf("alert %s uses %s, which /metrics does not serve", r.Alert, name)
				}
			}
		}
	}
	for _, want := range []string{"CreditdNotReady", "CreditdPersisterLagHigh", "CreditdDeadLetters", "CreditdWebhookBacklog",
		"CreditdHigh5xxRate", "CreditdRedisLatencyHigh", "CreditdPostgresLatencyHigh"} {
		if !alerts[want] {
			t.Errorf("alerts.yml has no %s", want)
		}
	}
}

// dashboard is the part of a Grafana dashboard JSON the test checks.
type dashboard struct {
	Title         string  `json:"title"`
	UID           string  `json:"uid"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
}

// TestDeployDashboard: deploy/grafana/creditd.json is a dashboard (valid
// JSON, a title, uid and schema version, a Prometheus datasource
// variable), every panel has a unique id, a type, a title, a place on the
// 24-column grid and Prometheus targets, and every target's PromQL parses
// and names only metrics /metrics serves.
func TestDeployDashboard(t *testing.T) {
	n := startNode(t, nil, nil)
	fams := scrape(t, n.URL+"/metrics")
	raw, err := os.ReadFile(filepath.Join(deployDir, "grafana", "creditd.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("creditd.json is not valid JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" || d.SchemaVersion < 30 || len(d.Panels) == 0 {
		t.Fatalf("dashboard header: title %q uid %q schema %d, %d panels", d.Title, d.UID, d.SchemaVersion, len(d.Panels))
	}
	hasDS := false
	for _, v := range d.Templating.List {
		hasDS = hasDS || (v.Name == "datasource" && v.Type == "datasource")
	}
	if !hasDS {
		t.Errorf("dashboard has no datasource variable")
	}
	p := parser.NewParser(parser.Options{})
	// Grafana's own variables, as Prometheus would see them expanded.
	expand := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m")
	ids := map[int]bool{}
	queries := 0
	for _, pn := range d.Panels {
		if ids[pn.ID] || pn.ID == 0 {
			t.Errorf("panel %q: id %d missing or repeated", pn.Title, pn.ID)
		}
		ids[pn.ID] = true
		if pn.Title == "" || pn.GridPos.W <= 0 || pn.GridPos.H <= 0 || pn.GridPos.X+pn.GridPos.W > 24 {
			t.Errorf("panel %d %q: no title or off the grid (%+v)", pn.ID, pn.Title, pn.GridPos)
		}
		switch pn.Type {
		case "row":
			continue
		case "timeseries", "stat", "table", "gauge", "bargauge", "heatmap":
		default:
			t.Errorf("panel %q: unknown type %q", pn.Title, pn.Type)
		}
		if pn.Datasource == nil || pn.Datasource.Type != "prometheus" || len(pn.Targets) == 0 {
			t.Errorf("panel %q: no Prometheus datasource or no targets", pn.Title)
		}
		refs := map[string]bool{}
		for _, tg := range pn.Targets {
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: target refId %q missing or repeated", pn.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			queries++
			for _, name := range metricNames(t, p, expand.Replace(tg.Expr)) {
				if !served(fams, name) {
					t.Errorf("panel %q uses %s, which /metrics does not serve", pn.Title, name)
				}
			}
		}
	}
	if queries < 10 {
		t.Errorf("dashboard has %d queries; it should cover every family group", queries)
	}
}

// TestDeployHAProxy: deploy/haproxy.cfg passes `haproxy -c`, and what
// HAProxy answers itself is creditd's problem document (issue 25): with no
// node ready a 503 with Retry-After, for a node that drops the connection
// a 502 with Retry-After, each naming the request's X-Request-Id (the
// client's when creditd would reuse it, else HAProxy's) and saying in
// Proxy-Status that the balancer answered. Skipped where
// HAProxy is not installed (`scripts/fleet.sh check` installs it).
func TestDeployHAProxy(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("haproxy not installed (scripts/fleet.sh check installs it)")
	}
	var ready atomic.Bool
	ready.Store(true)
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/readyz" && ready.Load():
			w.WriteHeader(http.StatusOK)
		case r.URL.Path == "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
		default: // a node killed mid-request
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = c.Close()
			}
		}
	}))
	t.Cleanup(node.Close)
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	env := append(os.Environ(), "FLEET_LISTEN="+listen, "FLEET_NODE1="+node.Listener.Addr().String(),
		fmt.Sprintf("FLEET_NODE2=127.0.0.1:%d", testenv.FreePort(t)), fmt.Sprintf("FLEET_NODE3=127.0.0.1:%d", testenv.FreePort(t)))
	cfg := filepath.Join(deployDir, "haproxy.cfg")
	check := exec.Command(bin, "-c", "-f", cfg)
	check.Env = env
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s", err, out)
	}
	var logs bytes.Buffer
	proxy := exec.Command(bin, "-db", "-f", cfg)
	proxy.Env, proxy.Stdout, proxy.Stderr = env, &logs, &logs
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proxy.Process.Kill()
		_ = proxy.Wait()
		if t.Failed() {
			t.Logf("haproxy:\n%s", logs.String())
		}
	})
	testenv.WaitTCP(t, listen, 10*time.Second)

	for _, tc := range []struct {
		name       string
		ready      bool
		path       string
		requestID  string // sent; "" sends none
		status     int
		kind       string
		retryAfter string
		sameID     bool // the answer names the id sent
	}{
		{"node drops the connection", true, "/v1/customers", "", 502, "unavailable", "1", false},
		{"client's request id kept", true, "/v1/customers", "client-id-1", 502, "unavailable", "1", true},
		{"no node ready", false, "/v1/customers", "", 503, "unavailable", "2", false},
		{"a request id creditd would not reuse is replaced", false, "/v1/customers", `bad"id`, 503, "unavailable", "2", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready.Store(tc.ready)
			deadline := time.Now().Add(15 * time.Second)
			for {
				req, _ := http.NewRequest("GET", "http://"+listen+tc.path, nil)
				if tc.requestID != "" {
					req.Header.Set("X-Request-Id", tc.requestID)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				raw, _ := io.ReadAll(res.Body)
				res.Body.Close()
				// The checks take a node out after two failures a second
				// apart, and back after two passes.
				if res.StatusCode != tc.status && time.Now().Before(deadline) {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				var p struct {
					Type      string `json:"type"`
					Title     string `json:"title"`
					Status    int    `json:"status"`
					Detail    string `json:"detail"`
					RequestID string `json:"request_id"`
				}
				dec := json.NewDecoder(bytes.NewReader(raw))
				dec.DisallowUnknownFields()
				if res.StatusCode != tc.status || dec.Decode(&p) != nil {
					t.Fatalf("%d %s, want a %d problem", res.StatusCode, raw, tc.status)
				}
				if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" {
					t.Errorf("Content-Type %q", ct)
				}
				if ps := res.Header.Get("Proxy-Status"); !strings.HasPrefix(ps, "haproxy; error=") {
					t.Errorf("Proxy-Status %q: the answer does not say the balancer gave it", ps)
				}
				if ra := res.Header.Get("Retry-After"); ra != tc.retryAfter {
					t.Errorf("Retry-After %q, want %q", ra, tc.retryAfter)
				}
				if p.Type != tc.kind || p.Status != tc.status || p.Title != http.StatusText(tc.status) || p.Detail == "" {
					t.Errorf("problem %+v, want type %s status %d", p, tc.kind, tc.status)
				}
				id := res.Header.Get("X-Request-Id")
				if id == "" || p.RequestID != id || (id == tc.requestID) != tc.sameID {
					t.Errorf("request_id %q, X-Request-Id %q, sent %q (kept: %v)", p.RequestID, id, tc.requestID, tc.sameID)
				}
				return
			}
		})
	}
}
