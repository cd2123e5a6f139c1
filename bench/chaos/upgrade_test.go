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

// TestResolveRelease: the default "from" is deploy/previous-release's
// commit, found in this repository's history without its tag; "to"
// defaults to the working tree at HEAD; any commit-ish resolves to its
// full sha. A clone without that history (shallow) skips.
func TestResolveRelease(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := git(ctx, root, "rev-parse", "HEAD"); err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	from, err := resolveRelease(ctx, root, "", true)
	if err != nil {
		t.Skipf("previous release not in this clone's history: %v", err)
	}
	if !shaRE.MatchString(from.Commit) || from.Name == "" {
		t.Fatalf("from: %+v", from)
	}
	to, err := resolveRelease(ctx, root, "", false)
	if err != nil || to.Name != "working tree" || !shaRE.MatchString(to.Commit) {
		t.Fatalf("to: %+v, %v", to, err)
	}
	head, err := resolveRelease(ctx, root, "HEAD", false)
	if err != nil || head.Commit != to.Commit {
		t.Fatalf("HEAD: %+v, %v; want commit %s", head, err, to.Commit)
	}
	if _, err := resolveRelease(ctx, root, "no-such-ref-anywhere", false); err == nil {
		t.Fatal("an unknown ref resolved")
	}
}

// TestLastLine: a failed start reports the node's last log line.
func TestLastLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(p, []byte("one\ncreditd: migrate: the database schema is newer than this creditd\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := lastLine(p); got != "creditd: migrate: the database schema is newer than this creditd" {
		t.Fatalf("lastLine = %q", got)
	}
	if got := lastLine(filepath.Join(t.TempDir(), "missing")); got != "" {
		t.Fatalf("missing file: %q", got)
	}
}
