package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/persist"
)

// trap is a TCP listener standing in for Redis or Postgres: it counts the
// connections made to it and closes them.
type trap struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newTrap(t *testing.T) *trap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr.accepted.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return tr
}

// runQuick is runCLI for what must answer at once (help, refusals): it
// fails the test when the command takes over 2 s.
func runQuick(t *testing.T, args ...string) (string, error) {
	t.Helper()
	start := time.Now()
	out, err := runCLI(t, args...)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("creditd %s took %s", strings.Join(args, " "), d)
	}
	return out, err
}

// runCLI runs the command tree on args in this process, with a deadline.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := rootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

// allCommands lists every command path of the tree, the root first.
func allCommands(c *cobra.Command) [][]string {
	out := [][]string{nil}
	for _, sub := range c.Commands() {
		for _, p := range allCommands(sub) {
			out = append(out, append([]string{sub.Name()}, p...))
		}
	}
	return out
}

// TestHelpTouchesNothing: --help on every command (and -h, and help X)
// answers at once with that command's usage, with REDIS_URL and
// DATABASE_URL pointing at listeners that count connections: none is
// made. version, --version and completion do not connect either.
func TestHelpTouchesNothing(t *testing.T) {
	redis, pg := newTrap(t), newTrap(t)
	clearConfigEnv(t)
	t.Setenv("REDIS_URL", "redis://"+redis.ln.Addr().String()+"/0")
	t.Setenv("DATABASE_URL", "postgres://nobody@"+pg.ln.Addr().String()+"/x?sslmode=disable&connect_timeout=1")
	// A broken setting must not matter to help either.
	t.Setenv("CREDITD_DEV", "yes")
	paths := allCommands(rootCmd())
	if len(paths) < 25 {
		t.Fatalf("only %d commands in the tree: %v", len(paths), paths)
	}
	for _, p := range paths {
		for _, flag := range []string{"--help", "-h"} {
			args := append(append([]string{}, p...), flag)
			out, err := runQuick(t, args...)
			if err != nil || !strings.Contains(out, "Usage:") {
				t.Errorf("creditd %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	}
	for _, args := range [][]string{{"help", "rebuild"}, {"version"}, {"--version"}, {"completion", "bash"},
		{"completion", "zsh"}, {"completion", "fish"}} {
		out, err := runQuick(t, args...)
		if err != nil || out == "" {
			t.Errorf("creditd %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if n := redis.accepted.Load() + pg.accepted.Load(); n != 0 {
		t.Fatalf("help, version and completion made %d connections to Redis or Postgres", n)
	}
}

// TestCommandsRefuseBeforeConnecting: a bad setting, bad arguments, an
// unknown command and an operator command with neither CREDITD_URL nor
// --direct all fail with a message saying why, and connect to nothing.
func TestCommandsRefuseBeforeConnecting(t *testing.T) {
	redis, pg := newTrap(t), newTrap(t)
	clearConfigEnv(t)
	t.Setenv("REDIS_URL", "redis://"+redis.ln.Addr().String()+"/0")
	t.Setenv("DATABASE_URL", "postgres://nobody@"+pg.ln.Addr().String()+"/x?sslmode=disable&connect_timeout=1")
	for _, tc := range []struct {
		args    []string
		env     string
		wantErr string
	}{
		{[]string{"rebuild"}, "CREDITD_MAX_PERSISTER_LAG=5", "CREDITD_MAX_PERSISTER_LAG=\"5\""},
		{[]string{"serve"}, "CREDITD_DEV=yes", "CREDITD_DEV=\"yes\""},
		{nil, "CREDITD_WEBHOOK_WORKERS=-1", "CREDITD_WEBHOOK_WORKERS"},
		// No command is serve: it applies serve's own check.
		{nil, "CREDITD_ADMIN_TOKEN=short", "CREDITD_ADMIN_TOKEN is 5 characters"},
		{[]string{"tenant", "get", uuid.NewString()}, "", "needs CREDITD_URL"},
		{[]string{"admin", "key", "create", uuid.NewString(), "live"}, "", "needs CREDITD_URL"},
		{[]string{"tenant", "list"}, "CREDITD_URL=http://127.0.0.1:1", "CREDITD_ADMIN_TOKEN is not set"},
		{[]string{"tenant", "get", "not-a-uuid", "--direct"}, "", "not a UUID"},
		{[]string{"reconcile", "--limit", "0"}, "", "--limit"},
		{[]string{"reconcile", "extra"}, "", "unknown command"},
		{[]string{"deadletters", "retry"}, "", "ids or --all"},
		{[]string{"deadletters", "discard", "1"}, "", "--note"},
		{[]string{"migrate"}, "", "migrate up"},
		{[]string{"frobnicate"}, "", "unknown command"},
		{[]string{"rate-limit", uuid.NewString(), "x", "1", "--direct"}, "", "PER_SECOND"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			if name, value, ok := strings.Cut(tc.env, "="); ok {
				t.Setenv(name, value)
			}
			_, err := runQuick(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if n := redis.accepted.Load() + pg.accepted.Load(); n != 0 {
		t.Fatalf("refused commands made %d connections to Redis or Postgres", n)
	}
}

// TestDirectCommandsNeverMigrate: on an empty database `tenant get
// --direct` and `rebuild` refuse (migrations pending) without creating
// anything; `migrate status` reports pending and exits non-zero; `migrate
// up` applies them; then the operator commands work; a schema newer than
// the binary makes every database command refuse, `migrate up` included.
func TestDirectCommandsNeverMigrate(t *testing.T) {
	clearConfigEnv(t)
	dbURL := testenv.Database(t)
	t.Setenv("DATABASE_URL", dbURL)
	t.Setenv("REDIS_URL", "redis://127.0.0.1:1/0")
	ctx := context.Background()
	pool, err := persist.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	tables := func() int {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	for _, args := range [][]string{{"tenant", "get", uuid.NewString(), "--direct"}, {"tenant", "list", "--direct"},
		{"deadletters", "list"}} {
		if _, err := runCLI(t, args...); !errors.Is(err, persist.ErrSchemaBehind) {
			t.Fatalf("%v on an empty database: %v, want ErrSchemaBehind", args, err)
		}
	}
	if n := tables(); n != 0 {
		t.Fatalf("commands other than migrate up created %d tables", n)
	}
	out, err := runCLI(t, "migrate", "status")
	if !errors.Is(err, persist.ErrSchemaBehind) || !strings.Contains(out, "pending: 001_init") {
		t.Fatalf("migrate status on an empty database: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "up"); err != nil || !strings.Contains(out, "migrations applied") {
		t.Fatalf("migrate up: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "migrate", "status"); err != nil || !strings.Contains(out, "up to date") {
		t.Fatalf("migrate status after up: %v\n%s", err, out)
	}

	out, err = runCLI(t, "tenant", "create", "Acme", "--direct")
	var created struct {
		Tenant struct {
			ID uuid.UUID `json:"id"`
		} `json:"tenant"`
		APIKeys struct{ Live, Sandbox string } `json:"api_keys"`
	}
	if err != nil || json.Unmarshal([]byte(out), &created) != nil || !strings.HasPrefix(created.APIKeys.Live, "ck_live_") {
		t.Fatalf("tenant create --direct: %v\n%s", err, out)
	}
	id := created.Tenant.ID.String()
	if out, err := runCLI(t, "admin", "--direct", "tenant", "get", id); err != nil || !strings.Contains(out, `"name": "Acme"`) {
		t.Fatalf("admin tenant get --direct: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "tenant", "list", "--direct"); err != nil || !strings.Contains(out, id) || !strings.Contains(out, "Acme") {
		t.Fatalf("tenant list --direct: %v\n%s", err, out)
	}
	out, err = runCLI(t, "key", "create", id, "sandbox", "--direct")
	var key struct {
		ID  uuid.UUID `json:"id"`
		Key string    `json:"key"`
	}
	if err != nil || json.Unmarshal([]byte(out), &key) != nil || !strings.HasPrefix(key.Key, "ck_test_") {
		t.Fatalf("key create --direct: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "key", "revoke", id, key.ID.String(), "--direct"); err != nil || !strings.Contains(out, key.ID.String()) {
		t.Fatalf("key revoke --direct: %v\n%s", err, out)
	}
	out, err = runCLI(t, "key", "list", id, "--direct", "--json")
	var keys struct {
		APIKeys []struct {
			ID        uuid.UUID  `json:"id"`
			RevokedAt *time.Time `json:"revoked_at"`
		} `json:"api_keys"`
	}
	if err != nil || json.Unmarshal([]byte(out), &keys) != nil || len(keys.APIKeys) != 3 || keys.APIKeys[2].ID != key.ID || keys.APIKeys[2].RevokedAt == nil {
		t.Fatalf("key list --direct --json: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "rate-limit", id, "5", "7", "--direct"); err != nil || !strings.Contains(out, `"rate_limit_burst": 7`) {
		t.Fatalf("rate-limit --direct: %v\n%s", err, out)
	}

	st, err := persist.Schema(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, 'newer')", st.Latest+1); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"tenant", "get", id, "--direct"}, {"migrate", "up"}, {"migrate", "status"},
		{"deadletters", "list"}, {"rebuild"}} {
		if _, err := runCLI(t, args...); !errors.Is(err, persist.ErrSchemaNewer) {
			t.Errorf("%v on a newer schema: %v, want ErrSchemaNewer", args, err)
		}
	}
}

// TestOperatorOverAdminAPI: with CREDITD_URL the operator commands call
// /admin/v1 with the bearer token, print the answer, turn 204s into a
// line of JSON and problems into an error with status, type and detail.
func TestOperatorOverAdminAPI(t *testing.T) {
	token := strings.Repeat("k", 40)
	tenant, key := uuid.New(), uuid.New()
	var calls []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(401)
			_, _ = w.Write([]byte(`{"type":"unauthorized","title":"Unauthorized","status":401,"detail":"missing or invalid admin token"}`))
			return
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		calls = append(calls, fmt.Sprintf("%s %s %v", r.Method, r.URL.Path, body))
		switch {
		case r.Method == "DELETE":
			w.WriteHeader(204)
		case r.URL.Path == "/admin/v1/tenants/"+tenant.String() && r.Method == "GET":
			_, _ = w.Write([]byte(`{"id":"` + tenant.String() + `","name":"Acme"}`))
		case r.URL.Path == "/admin/v1/tenants" && r.Method == "GET" && r.URL.Query().Get("cursor") == "":
			// Two pages: the list follows next_cursor.
			_, _ = w.Write([]byte(`{"data":[{"id":"` + tenant.String() + `","name":"Acme"}],"pagination":{"has_more":true,"next_cursor":"` + tenant.String() + `"}}`))
		case r.URL.Path == "/admin/v1/tenants" && r.Method == "GET":
			_, _ = w.Write([]byte(`{"data":[{"id":"` + key.String() + `","name":"Globex"}],"pagination":{"has_more":false,"next_cursor":null}}`))
		case r.URL.Path == "/admin/v1/tenants/"+tenant.String()+"/api-keys" && r.Method == "GET":
			_, _ = w.Write([]byte(`{"data":[{"id":"` + key.String() + `","tenant_id":"` + tenant.String() + `","environment":"live","created_at":"2026-01-01T00:00:00Z"}]}`))
		case r.Method == "PUT":
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(422)
			_, _ = w.Write([]byte(`{"type":"validation-error","title":"Invalid","status":422,"detail":"url must be https","field":"url"}`))
		default:
			w.WriteHeader(201)
			_, _ = w.Write([]byte(`{"ok":true}`))
		}
	}))
	defer srv.Close()
	clearConfigEnv(t)
	t.Setenv("CREDITD_URL", srv.URL+"/")
	t.Setenv("CREDITD_ADMIN_TOKEN", token)
	// The database is never asked: DATABASE_URL points nowhere.
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/x")

	if out, err := runCLI(t, "tenant", "get", tenant.String()); err != nil || !strings.Contains(out, `"name": "Acme"`) {
		t.Fatalf("tenant get: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "tenant", "list", "--json"); err != nil || !strings.Contains(out, "Acme") || !strings.Contains(out, "Globex") {
		t.Fatalf("tenant list over the admin API: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "key", "list", tenant.String(), "--json"); err != nil || !strings.Contains(out, key.String()) {
		t.Fatalf("key list over the admin API: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "admin", "key", "revoke", tenant.String(), key.String()); err != nil || !strings.Contains(out, `"revoked": "`+key.String()) {
		t.Fatalf("key revoke: %v\n%s", err, out)
	}
	if out, err := runCLI(t, "rate-limit", tenant.String(), "5", "7"); err != nil || !strings.Contains(out, `"ok": true`) {
		t.Fatalf("rate-limit: %v\n%s", err, out)
	}
	if _, err := runCLI(t, "webhook", "set", tenant.String(), "http://x"); err == nil ||
		!strings.Contains(err.Error(), "422 validation-error: url must be https (field url)") {
		t.Fatalf("webhook set with a refused URL: %v", err)
	}
	want := []string{
		"GET /admin/v1/tenants/" + tenant.String() + " map[]",
		"GET /admin/v1/tenants map[]",
		"GET /admin/v1/tenants map[]",
		"GET /admin/v1/tenants/" + tenant.String() + "/api-keys map[]",
		"DELETE /admin/v1/tenants/" + tenant.String() + "/api-keys/" + key.String() + " map[]",
		"PATCH /admin/v1/tenants/" + tenant.String() + " map[rate_limit_burst:7 rate_limit_per_second:5]",
		"PUT /admin/v1/tenants/" + tenant.String() + "/webhook map[url:http://x]",
	}
	if strings.Join(calls, "\n") != strings.Join(want, "\n") {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(calls, "\n"), strings.Join(want, "\n"))
	}
	t.Setenv("CREDITD_ADMIN_TOKEN", strings.Repeat("w", 40))
	if _, err := runCLI(t, "tenant", "get", tenant.String()); err == nil || !strings.Contains(err.Error(), "401 unauthorized") {
		t.Fatalf("wrong token: %v", err)
	}
	t.Setenv("CREDITD_ADMIN_TOKEN", "")
	if _, err := runCLI(t, "tenant", "get", tenant.String()); err == nil || !strings.Contains(err.Error(), "CREDITD_ADMIN_TOKEN is not set") {
		t.Fatalf("no token: %v", err)
	}
}

// TestHealthcheck: 0 on a 200 from /healthz (or /readyz with --ready), an
// error on anything else or nothing listening; CREDITD_ADDR's unspecified
// host is the loopback.
func TestHealthcheck(t *testing.T) {
	ready := atomic.Bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz", r.URL.Path == "/readyz" && ready.Load():
			w.WriteHeader(200)
		default:
			w.WriteHeader(503)
		}
	}))
	defer srv.Close()
	clearConfigEnv(t)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	t.Setenv("CREDITD_ADDR", ":"+port)
	if _, err := runCLI(t, "healthcheck"); err != nil {
		t.Fatalf("healthz on the local addr: %v", err)
	}
	if _, err := runCLI(t, "healthcheck", "--ready"); err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("readyz while not ready: %v", err)
	}
	ready.Store(true)
	t.Setenv("CREDITD_URL", srv.URL)
	t.Setenv("CREDITD_ADDR", "127.0.0.1:1")
	if _, err := runCLI(t, "healthcheck", "--ready"); err != nil {
		t.Fatalf("readyz on CREDITD_URL: %v", err)
	}
	t.Setenv("CREDITD_URL", "http://127.0.0.1:1")
	if _, err := runCLI(t, "healthcheck", "--timeout", "500ms"); err == nil {
		t.Fatal("nothing listening: no error")
	}
	for addr, want := range map[string]string{":8080": "http://127.0.0.1:8080", "0.0.0.0:9": "http://127.0.0.1:9",
		"[::]:9": "http://127.0.0.1:9", "10.1.2.3:80": "http://10.1.2.3:80", "[::1]:7": "http://[::1]:7"} {
		if got := localURL(addr); got != want {
			t.Errorf("localURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// TestVersion: version and --version print the stamped values when the
// build set them.
func TestVersion(t *testing.T) {
	version, commit, date = "v1.2.3", "abc123", "2026-11-24T04:00:00Z"
	defer func() { version, commit, date = "", "", "" }()
	for _, args := range [][]string{{"version"}, {"--version"}} {
		out, err := runCLI(t, args...)
		if err != nil || !strings.HasPrefix(out, "creditd v1.2.3 (commit abc123, built 2026-11-24T04:00:00Z, go") {
			t.Errorf("%v: %v %q", args, err, out)
		}
	}
}
