package idempotency

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestStorable: which statuses are a request's final answer.
func TestStorable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		want   bool
	}{
		{200, true}, {201, true}, {204, true},
		{400, true}, {404, true}, {409, true}, {422, true},
		{429, false}, {500, false}, {502, false}, {503, false},
		{304, false}, {199, false},
	} {
		if got := storable(tc.status); got != tc.want {
			t.Errorf("storable(%d) = %v, want %v", tc.status, got, tc.want)
		}
	}
}

// TestFingerprint: the request hash is sha256 hex of the environment's tag,
// method, path and body, so each of them tells two requests apart (the
// sandbox key reusing a live request's key never replays the live answer).
// Not parallel: it counts allocations.
func TestFingerprint(t *testing.T) {
	base := Fingerprint(false, []byte("POST"), []byte("/p"), []byte("{}"))
	sum := sha256.Sum256([]byte("live POST /p\n{}"))
	if want := hex.EncodeToString(sum[:]); base != want {
		t.Fatalf("Fingerprint = %s, want %s", base, want)
	}
	for _, tc := range []struct {
		name    string
		sandbox bool
		method  string
		path    string
		body    string
	}{
		{"the sandbox", true, "POST", "/p", "{}"},
		{"another method", false, "PATCH", "/p", "{}"},
		{"another path", false, "POST", "/q", "{}"},
		{"another body", false, "POST", "/p", "{ }"},
		{"the path's end moved into the body", false, "POST", "/", "p{}"},
	} {
		if got := Fingerprint(tc.sandbox, []byte(tc.method), []byte(tc.path), []byte(tc.body)); got == base {
			t.Errorf("%s: same fingerprint as the live request", tc.name)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() {
		_ = Fingerprint(true, []byte("POST"), []byte("/p"), []byte("{}"))
	}); allocs > 1 {
		t.Errorf("Fingerprint allocates %v times, want only its string", allocs)
	}
}

// TestContentTypeOf: the API's two types come back as constants, any other
// as it was.
// Not parallel: it counts allocations.
func TestContentTypeOf(t *testing.T) {
	for _, ct := range []string{"application/json", "application/problem+json", "text/plain; charset=utf-8", ""} {
		if got := contentTypeOf([]byte(ct)); got != ct {
			t.Errorf("contentTypeOf(%q) = %q", ct, got)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = contentTypeOf([]byte("application/problem+json")) }); allocs != 0 {
		t.Errorf("contentTypeOf allocates %v times for the problem type", allocs)
	}
}
