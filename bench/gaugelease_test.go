package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestGaugeLeaseRenewsTheLeaseTaken: the gauge-lease op renews the lease
// id the increment answered with, under the same customer and metric,
// and counts an op only when the renew succeeds.
func TestGaugeLeaseRenewsTheLeaseTaken(t *testing.T) {
	const lease = "01a20bc2-14c2-76d6-8c5d-6f89678c02d9"
	var mu sync.Mutex
	var paths, bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		paths, bodies = append(paths, r.URL.Path), append(bodies, string(b))
		mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/increment") {
			_, _ = io.WriteString(w, `{"billable_metric_key":"seats","current":1,"cap":9,"allowed":true,"headroom":8,`+
				`"lease":{"id":"`+lease+`","amount":1,"status":"active","expires_at":"2026-11-24T04:14:18.411Z"}}`)
			return
		}
		_, _ = io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	tg := &Target{Base: srv.URL, Key: "k", RunID: "run", Customers: []Customer{{Ext: "c0"}}, Acks: &Acks{}}
	g := NewGenerator(strings.TrimPrefix(srv.URL, "http://"), 1)
	r := g.Run(context.Background(), 1, time.Millisecond, tg.gaugeLease(false))
	want := []string{"/v1/customers/c0/entitlements/seats/increment", "/v1/customers/c0/entitlements/seats/leases/" + lease + "/renew"}
	if r.OK != 1 || len(paths) != 2 || paths[0] != want[0] || paths[1] != want[1] {
		t.Fatalf("ok %d, paths %v, want %v", r.OK, paths, want)
	}
	if !strings.Contains(bodies[0], `"lease_seconds":1`) || !strings.Contains(bodies[1], `"lease_seconds":1`) {
		t.Errorf("bodies %v", bodies)
	}
	if tg.Acks.GaugeApplied.Load() != 1 {
		t.Errorf("gauge applied %d", tg.Acks.GaugeApplied.Load())
	}
}
