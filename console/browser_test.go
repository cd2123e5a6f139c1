package console_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/e2e"
)

// chromiumPath is Debian's Chromium, which scripts/test.sh installs.
const chromiumPath = "/usr/bin/chromium"

// browserTimeout bounds the whole Playwright run.
const browserTimeout = 5 * time.Minute

// TestConsoleInBrowser drives the console in a real Chromium through
// Playwright (console/e2e/*.test.mjs): sign-in as operator and tenant, a
// tenant and key created, a grant moving the balance and the chart, a
// consume through the API showing in the ledger, a broken webhook failing
// and redelivered once fixed, another tenant's customer refused by URL, and
// a <script> metadata value shown as text. Each step saves a screenshot in
// console/e2e/test-output/.
//
// It needs node, the npm packages of console/e2e and Chromium: without them
// it skips, unless CONSOLE_BROWSER_REQUIRED=1 (scripts/test.sh sets it after
// installing them) turns a missing piece into a failure. It runs in the
// single-Redis phase only: the console reads what the API reads, and the
// cluster phase adds nothing to what a browser sees.
//
// Not parallel: it shortens engine.RetryDelays (restored after) so a broken
// endpoint dead-letters in seconds, before any parallel test starts.
func TestConsoleInBrowser(t *testing.T) {
	required := os.Getenv("CONSOLE_BROWSER_REQUIRED") == "1"
	missing := func(what string) {
		if required {
			t.Fatalf("browser test: %s is missing (CONSOLE_BROWSER_REQUIRED=1)", what)
		}
		t.Skipf("browser test skipped: %s is missing (scripts/test.sh installs it)", what)
	}
	if os.Getenv("TEST_REDIS_CLUSTER") != "" {
		t.Skip("browser test runs in the single-Redis phase")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node")
	}
	if _, err := os.Stat(chromiumPath); err != nil {
		missing(chromiumPath)
	}
	dir, err := filepath.Abs("e2e")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "playwright-core")); err != nil {
		missing("console/e2e/node_modules (npm ci in console/e2e)")
	}

	saved := engine.RetryDelays
	for i := range engine.RetryDelays {
		engine.RetryDelays[i] = 50 * time.Millisecond
	}
	t.Cleanup(func() { engine.RetryDelays = saved })

	s := e2e.NewStack(t)
	a, b := s.NewTenant("Acme"), s.NewTenant("Globex")
	cust := s.Do("POST", "/v1/customers", a.Live, "bc1", map[string]any{
		"external_id": "cust-browser", "display_name": "Ada Lovelace",
		"metadata": map[string]any{"note": "<script>window.pwned=1</script>"}})
	if cust.Status != 201 {
		t.Fatalf("create customer: %d %s", cust.Status, cust.Raw)
	}
	other := s.Do("POST", "/v1/customers", b.Live, "bc2", map[string]any{"external_id": "globex-1"})
	if other.Status != 201 {
		t.Fatalf("create customer: %d %s", other.Status, other.Raw)
	}
	if r := s.Do("POST", "/v1/customers/cust-browser/credits/grant", a.Live, "bg1",
		map[string]any{"credits": 5000, "source": "promotional", "reason": "welcome"}); r.Status != 201 {
		t.Fatalf("grant: %d %s", r.Status, r.Raw)
	}

	var received atomic.Int64
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	// A port nothing listens on: attempts fail with connection_refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	broken := "http://" + ln.Addr().String() + "/hook"
	_ = ln.Close()

	out := filepath.Join(dir, "test-output")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), browserTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-concurrency=1"}, testFiles()...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"CONSOLE_URL="+s.URL,
		"ADMIN_TOKEN="+e2e.AdminToken,
		"TENANT_ID="+a.ID,
		"TENANT_KEY="+a.Live,
		"OTHER_KEY="+b.Live,
		"CUSTOMER_ID="+cust.Body["id"].(string),
		"OTHER_TENANT_ID="+b.ID,
		"OTHER_CUSTOMER_ID="+other.Body["id"].(string),
		"HOOK_OK_URL="+hook.URL+"/hook",
		"HOOK_BROKEN_URL="+broken,
		"CHROMIUM="+chromiumPath,
		"SCREENSHOTS="+out,
	)
	outb, err := cmd.CombinedOutput()
	t.Logf("node --test:\n%s", outb)
	if err != nil {
		t.Fatalf("browser tests failed: %v", err)
	}
	if received.Load() == 0 && os.Getenv("CONSOLE_E2E_ONLY") == "" {
		t.Error("the fixed webhook endpoint received nothing")
	}
}

// testFiles are the Playwright scripts to run: CONSOLE_E2E_ONLY narrows
// them with node's --test-name-pattern (a debugging aid).
func testFiles() []string {
	if p := os.Getenv("CONSOLE_E2E_ONLY"); p != "" {
		return []string{"--test-name-pattern=" + p, "console.test.mjs"}
	}
	return []string{"console.test.mjs"}
}
