package changelists

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestOpenAPIRoundTrip: api/openapi.json reads and writes back byte for
// byte, so the change lists' edits of it change only what they mean to.
func TestOpenAPIRoundTrip(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "api", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := parseJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	if out := n.encode(); !bytes.Equal(out, raw) {
		i := 0
		for i < len(out) && i < len(raw) && out[i] == raw[i] {
			i++
		}
		t.Fatalf("api/openapi.json does not round-trip: first difference at byte %d: %q", i, out[i:min(len(out), i+80)])
	}
}
