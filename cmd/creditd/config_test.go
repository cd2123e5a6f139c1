package main

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
)

// clearConfigEnv empties every variable of config for the test (an empty
// value is the default, as unset is).
func clearConfigEnv(t *testing.T) {
	t.Helper()
	for _, f := range configFields() {
		t.Setenv(f.Tag.Get("env"), "")
	}
}

// TestConfigDefaults: with nothing set, every field has README's default.
func TestConfigDefaults(t *testing.T) {
	clearConfigEnv(t)
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := config{RedisURL: "redis://127.0.0.1:6379/0", DatabaseURL: "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		Addr: ":8080", LogLevel: "info", RedisPrefix: "cd", MaxLag: 5 * time.Second, SweepInterval: time.Second,
		BodyLimitBytes: 1 << 20, Consumer: host, RedisPoolSize: 64, DevFile: ".data/dev-tenant.json", ReservationSweep: time.Minute,
		Scheduler: time.Second, WebhookWorkers: 8, WebhookPoll: 200 * time.Millisecond, MaxConnsPerIP: 1024,
		ReplicaAcks: lua.ReplicaAcksAuto, ReplicaAckTimeout: lua.DefaultReplicaAckTimeout,
		ReconcileSample: 20, ReconcileSampleInterval: time.Minute}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults\n got %+v\nwant %+v", c, want)
	}
}

// TestConfigStrict: a value that does not parse, or a duration or count
// that is not positive, is an error naming the variable; good values pass
// through typed.
func TestConfigStrict(t *testing.T) {
	for _, tc := range []struct {
		name, env, value string
		// wantErr is in the error; empty: the value is accepted and check
		// reads it back.
		wantErr string
		check   func(config) bool
	}{
		{"duration without unit", "CREDITD_MAX_PERSISTER_LAG", "5", "CREDITD_MAX_PERSISTER_LAG=\"5\"", nil},
		{"duration", "CREDITD_MAX_PERSISTER_LAG", "750ms", "", func(c config) bool { return c.MaxLag == 750*time.Millisecond }},
		{"zero duration", "CREDITD_SWEEP_INTERVAL", "0s", "CREDITD_SWEEP_INTERVAL=\"0s\": must be a positive duration", nil},
		{"negative duration", "CREDITD_WEBHOOK_POLL", "-1s", "CREDITD_WEBHOOK_POLL", nil},
		{"bool yes", "CREDITD_DEV", "yes", "CREDITD_DEV=\"yes\"", nil},
		{"bool 1", "CREDITD_DEV", "1", "", func(c config) bool { return c.Dev }},
		{"bool false", "CREDITD_WEBHOOK_ALLOW_PRIVATE", "false", "", func(c config) bool { return !c.AllowPrivate }},
		{"int word", "CREDITD_WEBHOOK_WORKERS", "many", "CREDITD_WEBHOOK_WORKERS=\"many\"", nil},
		{"int float", "CREDITD_REDIS_POOL_SIZE", "6.5", "CREDITD_REDIS_POOL_SIZE", nil},
		{"negative int", "CREDITD_MAX_CONNS_PER_IP", "-3", "CREDITD_MAX_CONNS_PER_IP=\"-3\": must be a positive whole number", nil},
		{"zero int", "CREDITD_BODY_LIMIT_BYTES", "0", "CREDITD_BODY_LIMIT_BYTES", nil},
		{"int", "CREDITD_MAX_CONNS_PER_IP", "50", "", func(c config) bool { return c.MaxConnsPerIP == 50 }},
		{"log level", "LOG_LEVEL", "loud", "LOG_LEVEL=\"loud\"", nil},
		{"log level warn", "LOG_LEVEL", "warn", "", func(c config) bool { return c.LogLevel == "warn" }},
		{"replica acks word", "CREDITD_REPLICA_ACKS", "one", "CREDITD_REPLICA_ACKS=\"one\"", nil},
		{"replica acks negative", "CREDITD_REPLICA_ACKS", "-3", "CREDITD_REPLICA_ACKS", nil},
		{"replica acks auto", "CREDITD_REPLICA_ACKS", "auto", "", func(c config) bool {
			return c.ReplicaAcks == lua.ReplicaAcksAuto && c.appReplicaAcks() == lua.ReplicaAcksAuto
		}},
		{"replica acks off", "CREDITD_REPLICA_ACKS", "0", "", func(c config) bool { return c.ReplicaAcks == 0 && c.appReplicaAcks() == app.ReplicaAcksOff }},
		{"replica acks 2", "CREDITD_REPLICA_ACKS", "2", "", func(c config) bool { return c.appReplicaAcks() == 2 }},
		{"instance", "CREDITD_INSTANCE", "node-7", "", func(c config) bool { return c.Consumer == "node-7" }},
		{"reconcile sample off", "CREDITD_RECONCILE_SAMPLE", "0", "", func(c config) bool { return c.ReconcileSample == 0 }},
		{"reconcile sample", "CREDITD_RECONCILE_SAMPLE", "50", "", func(c config) bool { return c.ReconcileSample == 50 }},
		{"reconcile sample negative", "CREDITD_RECONCILE_SAMPLE", "-1", "CREDITD_RECONCILE_SAMPLE=\"-1\"", nil},
		{"reconcile sample too big", "CREDITD_RECONCILE_SAMPLE", "1001", "CREDITD_RECONCILE_SAMPLE", nil},
		{"reconcile sample interval zero", "CREDITD_RECONCILE_SAMPLE_INTERVAL", "0s", "CREDITD_RECONCILE_SAMPLE_INTERVAL", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearConfigEnv(t)
			t.Setenv(tc.env, tc.value)
			c, err := loadConfig()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s=%q: error %v, want one containing %q", tc.env, tc.value, err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(c) {
				t.Fatalf("%s=%q: %v, config %+v", tc.env, tc.value, err, c)
			}
		})
	}
}

// TestConfigAdminToken: serve refuses an admin token under 32 characters
// with a message naming the variable; unset (admin API off) and long
// tokens pass.
func TestConfigAdminToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, token string
		ok          bool
	}{
		{"unset", "", true},
		{"31 characters", strings.Repeat("t", 31), false},
		{"dev default of old", "dev-admin-token", false},
		{"32 characters", strings.Repeat("t", 32), true},
		{"64 hex", strings.Repeat("ab", 32), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := config{AdminToken: tc.token}.check()
			if tc.ok != (err == nil) {
				t.Fatalf("check(%q) = %v, want ok=%v", tc.token, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "CREDITD_ADMIN_TOKEN") {
				t.Fatalf("error does not name the variable: %v", err)
			}
		})
	}
}

// TestConfigEffectiveMasksSecrets: the logged configuration names every
// variable, shows the admin token only as set or unset, and hides
// passwords in URLs (one URL, a seed list, a key=value DSN).
func TestConfigEffectiveMasksSecrets(t *testing.T) {
	clearConfigEnv(t)
	token := strings.Repeat("s3cr3t", 6)
	t.Setenv("CREDITD_ADMIN_TOKEN", token)
	t.Setenv("REDIS_URL", "redis://:hunter2@r1:6379/0,redis://default:hunter3@r2:6379")
	t.Setenv("DATABASE_URL", "postgres://app:pg-pass@db:5432/credit?sslmode=disable&password=qpass")
	t.Setenv("CREDITD_URL", "https://ops:urlpass@creditd.internal")
	c, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	eff := c.effective()
	if len(eff) != len(configFields()) {
		t.Fatalf("%d settings logged, config has %d", len(eff), len(configFields()))
	}
	all := ""
	got := map[string]string{}
	for _, s := range eff {
		all += s.Name + "=" + s.Value + "\n"
		got[s.Name] = s.Value
	}
	for _, secret := range []string{token, "hunter2", "hunter3", "pg-pass", "qpass", "urlpass"} {
		if strings.Contains(all, secret) {
			t.Errorf("effective configuration shows %q:\n%s", secret, all)
		}
	}
	for name, want := range map[string]string{
		"CREDITD_ADMIN_TOKEN":       "set (36 characters)",
		"REDIS_URL":                 "redis://:xxxxx@r1:6379/0,redis://default:xxxxx@r2:6379",
		"CREDITD_URL":               "https://ops:xxxxx@creditd.internal",
		"CREDITD_MAX_PERSISTER_LAG": "5s",
		"CREDITD_REPLICA_ACKS":      "auto",
	} {
		if got[name] != want {
			t.Errorf("%s logged as %q, want %q", name, got[name], want)
		}
	}
	if !strings.Contains(got["DATABASE_URL"], "app:xxxxx@db:5432") {
		t.Errorf("DATABASE_URL logged as %q", got["DATABASE_URL"])
	}
	if got := redactURLs("host=db user=app password='p w' dbname=x"); strings.Contains(got, "p w") {
		t.Errorf("DSN password shown: %q", got)
	}
}

// readmeRow is one row of README's configuration table: | `NAME` | default | meaning |.
var readmeRow = regexp.MustCompile("(?m)^\\| `([A-Z][A-Z0-9_]*)` \\| ([^|]*) \\|")

// TestREADMEConfigTable: README.md's configuration table lists exactly the
// variables config reads, and shows each envDefault as the default (a
// variable without one says unset, or what stands in for it).
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "\n## Configuration\n")
	if !ok {
		t.Fatal("README.md has no ## Configuration section")
	}
	if i := strings.Index(table, "\n## "); i >= 0 {
		table = table[:i]
	}
	readme := map[string]string{}
	for _, m := range readmeRow.FindAllStringSubmatch(table, -1) {
		readme[m[1]] = strings.TrimSpace(m[2])
	}
	for _, f := range configFields() {
		name := f.Tag.Get("env")
		def, inREADME := readme[name]
		if !inREADME {
			t.Errorf("%s is read by creditd (cmd/creditd/config.go) but not in README's configuration table", name)
			continue
		}
		delete(readme, name)
		if d, ok := f.Tag.Lookup("envDefault"); ok && def != "`"+d+"`" {
			t.Errorf("README gives %s the default %s; config.go has `%s`", name, def, d)
		}
	}
	for name := range readme {
		t.Errorf("README's configuration table lists %s, which config.go does not read", name)
	}
}
