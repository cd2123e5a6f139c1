package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestParseRelease: deploy/previous-release parses, and a file without a
// full sha is refused rather than read as a short one (a short sha can
// become ambiguous as history grows).
func TestParseRelease(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", previousReleaseFile))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := parseRelease(string(b)); err != nil || r.Name == "" {
		t.Fatalf("%s: %+v, %v", previousReleaseFile, r, err)
	}
	for _, tc := range []struct {
		name, text string
		ok         bool
	}{
		{"both", "# c\ntag v1\ncommit f59513c64d9639e5d069287fd242f6ad7d9c0969\n", true},
		{"short sha", "tag v1\ncommit f59513c\n", false},
		{"no tag", "commit f59513c64d9639e5d069287fd242f6ad7d9c0969\n", false},
		{"unknown line", "tag v1\ncommit f59513c64d9639e5d069287fd242f6ad7d9c0969\nbranch main\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseRelease(tc.text); (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok %v", err, tc.ok)
			}
		})
	}
}

// TestLogCommit: the last "creditd starting" line of a log that two
// binaries wrote (start-node appends) names the running one.
func TestLogCommit(t *testing.T) {
	p := filepath.Join(t.TempDir(), "creditd-1.log")
	log := `{"level":"info","service":"creditd","version":"v0.3.0","commit":"aaaa","message":"creditd starting"}
{"level":"info","message":"shutting down"}
{"level":"info","service":"creditd","version":"v0.4.0","commit":"bbbb","message":"creditd starting"}
{"level":"info","message":"creditd listening"}
`
	if err := os.WriteFile(p, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := logCommit(p); got != "bbbb" {
		t.Fatalf("logCommit = %q, want bbbb", got)
	}
	if got := logCommit(filepath.Join(t.TempDir(), "missing")); got != "?" {
		t.Fatalf("missing log: %q", got)
	}
}
